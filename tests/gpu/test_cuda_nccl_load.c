/* test_cuda_nccl_load.c — kernels/cuda/nccl.c finds NCCL at run time without a GPU: the
 * library opens, every entry point medley calls resolves, its version is new enough, and it
 * makes a communicator id (ncclGetUniqueId needs no device); an empty group starts and ends.
 * Where libnccl cannot be loaded the answer must be MD_EUNSUPP saying so (printed; the test
 * then passes, as the backend runs there without collectives). Label unit: runs in every
 * CUDA build; exits 77 (skip) on a build without NCCL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"

#ifdef MEDLEY_HAVE_NCCL
static void test_library_loads_and_makes_an_id(void **state) {
    uint8_t id[CUDA_COMM_ID_BYTES], zero[CUDA_COMM_ID_BYTES] = {0};
    memset(id, 0, sizeof id);
    md_err e = {0};
    int rc = cuda_comm_unique_id(id, &e);
    if (rc == MD_EUNSUPP) {
        printf("no NCCL on this host: %s\n", e.msg);
        assert_non_null(strstr(e.msg, "NCCL"));
        assert_int_equal(cuda_comm_group_start(&e), MD_EUNSUPP);
        return;
    }
    if (rc)
        fail_msg("cuda_comm_unique_id: %s", e.msg);
    assert_memory_not_equal(id, zero, sizeof id);
    uint8_t id2[CUDA_COMM_ID_BYTES];
    assert_int_equal(cuda_comm_unique_id(id2, &e), 0);
    assert_memory_not_equal(id, id2, sizeof id); /* a fresh id per communicator */
    assert_int_equal(cuda_comm_group_start(&e), 0);
    assert_int_equal(cuda_comm_group_end(&e), 0);
    printf("NCCL loaded; two ids made, an empty group ended\n");
}
#endif

int main(void) {
#ifndef MEDLEY_HAVE_NCCL
    printf("SKIP: the CUDA backend was built without NCCL\n");
    return 77;
#else
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_library_loads_and_makes_an_id)};
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
