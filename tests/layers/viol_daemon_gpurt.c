/* Refused: the GPU runtime shared by cuda and hip is theirs, not the
 * daemon's (tests/layers). */
#include "backends/gpurt/gpurt.h"
typedef int dspk_layers_nonempty;
