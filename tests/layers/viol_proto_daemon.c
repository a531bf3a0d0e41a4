/* Refused: proto knows nothing of the daemon (tests/layers). */
#include "daemon/dspkd.h"
typedef int dspk_layers_nonempty;
