/* dtype.c — the table of GGUF tensor types behind dtype.h: name, elements and bytes per
 * block, and whether medley computes with the type. */
#include "common/dtype.h"

static const struct {
    const char *name;
    int blck;
    int size;
    int supported;
} type_table[] = {
    [MD_TYPE_F32] = {"F32", 1, 4, 1},
    [MD_TYPE_F16] = {"F16", 1, 2, 1},
    [MD_TYPE_Q4_0] = {"Q4_0", 32, 18, 1},
    [MD_TYPE_Q4_1] = {"Q4_1", 32, 20, 1},
    [MD_TYPE_Q5_0] = {"Q5_0", 32, 22, 0},
    [MD_TYPE_Q5_1] = {"Q5_1", 32, 24, 0},
    [MD_TYPE_Q8_0] = {"Q8_0", 32, 34, 1},
    [MD_TYPE_Q8_1] = {"Q8_1", 32, 40, 0},
    [MD_TYPE_Q2_K] = {"Q2_K", 256, 84, 0},
    [MD_TYPE_Q3_K] = {"Q3_K", 256, 110, 0},
    [MD_TYPE_Q4_K] = {"Q4_K", 256, 144, 1},
    [MD_TYPE_Q5_K] = {"Q5_K", 256, 176, 0},
    [MD_TYPE_Q6_K] = {"Q6_K", 256, 210, 1},
    [MD_TYPE_Q8_K] = {"Q8_K", 256, 292, 0},
    [MD_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, 0},
    [MD_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74, 0},
    [MD_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, 0},
    [MD_TYPE_IQ1_S] = {"IQ1_S", 256, 50, 0},
    [MD_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, 0},
    [MD_TYPE_IQ3_S] = {"IQ3_S", 256, 110, 0},
    [MD_TYPE_IQ2_S] = {"IQ2_S", 256, 82, 0},
    [MD_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136, 0},
    [MD_TYPE_I8] = {"I8", 1, 1, 0},
    [MD_TYPE_I16] = {"I16", 1, 2, 0},
    [MD_TYPE_I32] = {"I32", 1, 4, 0},
    [MD_TYPE_I64] = {"I64", 1, 8, 0},
    [MD_TYPE_F64] = {"F64", 1, 8, 0},
    [MD_TYPE_IQ1_M] = {"IQ1_M", 256, 56, 0},
    [MD_TYPE_BF16] = {"BF16", 1, 2, 1},
    [MD_TYPE_TQ1_0] = {"TQ1_0", 256, 54, 0},
    [MD_TYPE_TQ2_0] = {"TQ2_0", 256, 66, 0},
};
#define N_TYPES ((int)(sizeof type_table / sizeof type_table[0]))

const char *md_type_name(int type) {
    return type >= 0 && type < N_TYPES ? type_table[type].name : NULL;
}

int md_type_block(int type) {
    return type >= 0 && type < N_TYPES ? type_table[type].blck : 0;
}

size_t md_type_block_bytes(int type) {
    return type >= 0 && type < N_TYPES ? (size_t)type_table[type].size : 0;
}

size_t md_type_row_bytes(int type, int64_t n) {
    int bs = md_type_block(type);
    if (!bs || n < 0 || n % bs)
        return 0;
    return (size_t)(n / bs) * md_type_block_bytes(type);
}

int md_type_supported(int type) {
    return type >= 0 && type < N_TYPES && type_table[type].supported;
}
