/* test_cuda_step_plan.c — the CUDA backend's host-side step planning (kernels/cuda/
 * step_plan.c), which runs without a GPU: a mixed step becomes the right decode entries and
 * prefill tiles, and every out-of-range or out-of-order index is refused with a sentence
 * before the device would follow it; an encoder step (no KV blocks) becomes tiles of its whole
 * sequences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/step_plan.h"

enum { T = 43, S = 3, MAXB = 8, BT = 16 };

static int32_t tokens[T], seq[T], pos[T], slot[T], seq_len[S], table[S * MAXB], rows[S];
static int32_t dec[3 * T], tiles[4 * (T / 16 + S)];

/* seq 0: positions 0..36 (one chunk), seq 1: position 50 (decode), seq 2: 20..24. */
static md_batch make(void) {
    int t = 0;
    for (int p = 0; p <= 36; p++, t++)
        seq[t] = 0, pos[t] = p;
    seq[t] = 1, pos[t++] = 50;
    for (int p = 20; p <= 24; p++, t++)
        seq[t] = 2, pos[t] = p;
    for (int i = 0; i < S * MAXB; i++)
        table[i] = (i * 5 + 3) % 64;
    for (int i = 0; i < T; i++) {
        slot[i] = table[seq[i] * MAXB + pos[i] / BT] * BT + pos[i] % BT;
        tokens[i] = i;
    }
    seq_len[0] = 37, seq_len[1] = 51, seq_len[2] = 25;
    rows[0] = 36, rows[1] = 37, rows[2] = 42;
    return (md_batch){.n_tokens = T,
                      .n_seqs = S,
                      .tokens = tokens,
                      .tok_seq = seq,
                      .tok_pos = pos,
                      .slot = slot,
                      .seq_len = seq_len,
                      .block_table = table,
                      .max_blocks = MAXB,
                      .block_tokens = BT,
                      .logit_rows = rows,
                      .n_logits = S};
}

static void test_mixed_step_is_sorted_into_decode_and_tiles(void **state) {
    md_batch b = make();
    cuda_step_plan p;
    md_err e = {0};
    assert_int_equal(cuda_plan_step(&b, dec, tiles, &p, &e), 0);
    assert_int_equal(p.n_dec, 1);
    assert_int_equal(dec[0], 37); /* token row */
    assert_int_equal(dec[1], 1);  /* block-table row */
    assert_int_equal(dec[2], 51); /* sees positions 0..50 */
    assert_int_equal(p.max_dec_len, 51);
    assert_int_equal(p.max_len, 51); /* seq 1's decode; seq 0's prefill reads 37 */
    /* seq 0: 37 tokens in tiles of 16, 16, 5; seq 2: one tile of 5 */
    const int32_t want[4][4] = {{0, 0, 16, 0}, {0, 16, 16, 16}, {0, 32, 5, 32}, {2, 38, 5, 20}};
    assert_int_equal(p.n_tiles, 4);
    assert_memory_equal(tiles, want, sizeof want);
    /* blocks read: seq 0 rows 0..2, seq 1 rows 8..11, seq 2 rows 16..17 of the table */
    int64_t mx = -1;
    int used[][2] = {{0, 2}, {8, 11}, {16, 17}};
    for (int i = 0; i < 3; i++)
        for (int k = used[i][0]; k <= used[i][1]; k++)
            mx = table[k] > mx ? table[k] : mx;
    assert_int_equal(p.max_block, mx);
    /* the decode token earlier: seq 0's prefill (positions to 36) is the longest read */
    pos[37] = 10;
    assert_int_equal(cuda_plan_step(&b, dec, tiles, &p, &e), 0);
    assert_int_equal(p.max_dec_len, 11);
    assert_int_equal(p.max_len, 37);
}

static void expect_refused(md_batch *b, const char *what) {
    cuda_step_plan p;
    md_err e = {0};
    assert_int_equal(cuda_plan_step(b, dec, tiles, &p, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, what));
    printf("refused: %s\n", e.msg);
}

static void test_bad_steps_are_refused(void **state) {
    md_batch b = make();
    seq[5] = 3; /* no such sequence */
    expect_refused(&b, "sequence 3 of 3");
    b = make();
    pos[10] = 12; /* positions of a run must follow each other */
    expect_refused(&b, "position 12");
    b = make();
    slot[3] = -1;
    expect_refused(&b, "slot -1");
    b = make();
    pos[37] = MAXB * BT; /* beyond the block table */
    expect_refused(&b, "does not fit");
    b = make();
    table[1 * MAXB + 2] = -1; /* seq 1 reaches block 3 */
    expect_refused(&b, "sequence 1 has no block 2");
    b = make();
    rows[2] = T;
    expect_refused(&b, "logit row 43");
}

static void test_single_token_sequences_are_all_decode(void **state) {
    int32_t s1[4] = {0, 1, 2, 3}, p1[4] = {5, 0, 17, 31}, sl[4] = {5, 16, 33, 63}, tb[4 * 2],
            r1[4] = {0, 1, 2, 3}, lens[4] = {6, 1, 18, 32}, tk[4] = {1, 2, 3, 4};
    for (int i = 0; i < 8; i++)
        tb[i] = i;
    md_batch b = {.n_tokens = 4,
                  .n_seqs = 4,
                  .tokens = tk,
                  .tok_seq = s1,
                  .tok_pos = p1,
                  .slot = sl,
                  .seq_len = lens,
                  .block_table = tb,
                  .max_blocks = 2,
                  .block_tokens = 16,
                  .logit_rows = r1,
                  .n_logits = 4};
    cuda_step_plan p;
    md_err e = {0};
    assert_int_equal(cuda_plan_step(&b, dec, tiles, &p, &e), 0);
    assert_int_equal(p.n_dec, 4);
    assert_int_equal(p.n_tiles, 0);
    assert_int_equal(p.max_dec_len, 32);
    assert_int_equal(p.max_len, 32);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dec[3 * i], i);
        assert_int_equal(dec[3 * i + 2], p1[i] + 1);
    }
}

/* An encoder step (no KV blocks): sequences of 1, 37 and 16 tokens become tiles of up to 16
 * queries that each name their whole sequence; a sequence in two runs is refused. */
static void test_encoder_step_is_tiled_by_sequence(void **state) {
    int32_t sq[54], ps[54], t = 0;
    const int len[3] = {1, 37, 16};
    for (int s = 0; s < 3; s++)
        for (int p = 0; p < len[s]; p++, t++)
            sq[t] = s, ps[t] = p;
    md_batch b = {.n_tokens = 54, .n_seqs = 3, .tokens = tokens, .tok_seq = sq, .tok_pos = ps};
    int32_t ti[4 * (54 / 16 + 3)];
    int n = 0, longest = 0;
    md_err e = {0};
    assert_int_equal(cuda_plan_enc_step(&b, 16, ti, &n, &longest, &e), 0);
    assert_int_equal(longest, 37);
    /* {first row of the sequence, its length, first query row, queries} */
    const int32_t want[][4] = {
        {0, 1, 0, 1}, {1, 37, 1, 16}, {1, 37, 17, 16}, {1, 37, 33, 5}, {38, 16, 38, 16}};
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 4; k++)
            assert_int_equal(ti[4 * i + k], want[i][k]);
    sq[53] = 0; /* sequence 0 again after 2: a fourth run of three sequences */
    assert_int_equal(cuda_plan_enc_step(&b, 16, ti, &n, &longest, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, "contiguous"));
    sq[53] = 3;
    assert_int_equal(cuda_plan_enc_step(&b, 16, ti, &n, &longest, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, "sequence 3 of 3"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_step_is_sorted_into_decode_and_tiles),
        cmocka_unit_test(test_bad_steps_are_refused),
        cmocka_unit_test(test_single_token_sequences_are_all_decode),
        cmocka_unit_test(test_encoder_step_is_tiled_by_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
