/* matmul_avx2.c — AVX2+FMA+F16C tile kernels and activation quantizers. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

const kernel_table cpu_kernels_avx2 = {0};
