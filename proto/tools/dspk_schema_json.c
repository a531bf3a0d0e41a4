/*
 * Writes the protocol's description (proto/schema.c) as JSON to the file
 * named by argv[1], or stdout: the build installs it as
 * share/dspk/protocol.json for clients in other languages, and
 * tests/proto/schema_docs.py checks docs/protocol.md against it.
 */
#include <stdio.h>

#include "proto/schema.h"

int main(int argc, char **argv) {
  FILE *f = argc > 1 ? fopen(argv[1], "w") : stdout;
  int rc;
  if (!f) {
    perror(argv[1]);
    return 1;
  }
  rc = dspk__schema_json(f);
  if (f != stdout && fclose(f) != 0)
    rc = -1;
  return rc == 0 ? 0 : 1;
}
