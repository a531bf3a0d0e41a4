/* Refused: a driver table's headers are its backend's and its worker's,
 * not the daemon's (tests/layers). */
#include "backends/cuda/cuda_internal.h"
typedef int dspk_layers_nonempty;
