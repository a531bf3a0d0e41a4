/* Refused: the cache knows nothing of the backends (tests/layers). */
#include "backends/backend.h"
typedef int dspk_layers_nonempty;
