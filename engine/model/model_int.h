/* model_int.h — private to engine/model/: what model_load.c (hyperparameters, weights onto a
 * backend) and model.c (buffers, the forward pass) share. */
#ifndef MEDLEY_ENGINE_MODEL_INT_H
#define MEDLEY_ENGINE_MODEL_INT_H

#include "engine/model/model.h"

/* A backend op of model m's backend: CALL(m, buf_alloc, bytes, &buf, e). */
#define BE(m) ((m)->be)
#define CALL(m, op, ...) BE(m)->ops->op(BE(m), __VA_ARGS__)

#endif
