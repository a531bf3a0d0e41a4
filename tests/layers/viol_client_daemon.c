/* Refused: the client library knows only the wire format (tests/layers). */
#include "daemon/dspkd.h"
typedef int dspk_layers_nonempty;
