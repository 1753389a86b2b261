#pragma once
typedef void *cublasHandle_t;
typedef int cublasStatus_t;
