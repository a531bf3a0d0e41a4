/*
 * A main() for the fuzz harnesses in builds without libFuzzer (gcc, the
 * plain and ASan builds): runs LLVMFuzzerTestOneInput once on every file
 * named on the command line, or on every file of a directory named there,
 * so the seed corpora (and any crash input added to them) replay as
 * ordinary ctests.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_common.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char *buf = NULL;
  long n;

  if (!f) {
    fprintf(stderr, "%s: cannot open\n", path);
    return 1;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    fprintf(stderr, "%s: cannot size\n", path);
    return 1;
  }
  /* An exact-size heap copy, so ASan sees any read past the input. */
  buf = malloc(n ? (size_t)n : 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    fprintf(stderr, "%s: cannot read\n", path);
    return 1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int ran = 0, bad = 0;

  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "%s: not found\n", argv[i]);
      return 1;
    }
    if (S_ISDIR(st.st_mode)) {
      struct dirent **ents;
      int n = scandir(argv[i], &ents, NULL, alphasort);
      if (n < 0)
        return 1;
      for (int k = 0; k < n; k++) {
        char path[4096];
        if (ents[k]->d_name[0] != '.') {
          snprintf(path, sizeof path, "%s/%s", argv[i], ents[k]->d_name);
          bad |= run_file(path);
          ran++;
        }
        free(ents[k]);
      }
      free(ents);
    } else {
      bad |= run_file(argv[i]);
      ran++;
    }
  }
  printf("%d inputs replayed\n", ran);
  /* An empty corpus would make this test pass without testing anything. */
  return bad || ran == 0;
}
