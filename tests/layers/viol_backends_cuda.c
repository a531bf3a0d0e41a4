/* Refused: a driver table's headers are its backend's and worker's, not
 * the registry's (tests/layers). */
#include "backends/cuda/cuda_internal.h"
typedef int dspk_layers_nonempty;
