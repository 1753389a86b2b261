/* matmul_avx512.c — AVX-512 (F, BW, VL, VNNI) tile kernels. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

const kernel_table cpu_kernels_avx512 = {0};
