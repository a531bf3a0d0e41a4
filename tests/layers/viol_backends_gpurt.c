/* Refused: the registry and the cpu backend (dspk_backends) link the GPU
 * backends but see none of the runtime they share (tests/layers). */
#include "backends/gpurt/gpurt.h"
typedef int dspk_layers_nonempty;
