/*
 * dspk-submit metrics: prints the daemon's Prometheus text (the `metrics`
 * method), as is, or with --json as a list of samples
 * [{"name":..,"labels":{..},"value":..}] for scripts without a Prometheus
 * parser.  The text is the daemon's own exposition format 0.0.4 output, so
 * each sample line is NAME{LABELS} VALUE with label values escaped.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/submit/submit.h"

/* Prints the labels of one sample, {a="x",b="y"}, as a JSON object; p
 * points after the '{'.  Returns the position after the '}', or NULL. */
static const char *json_labels(const char *p) {
  int first = 1;
  putchar('{');
  while (*p && *p != '}') {
    const char *eq = strchr(p, '=');
    if (!eq || eq[1] != '"')
      return NULL;
    if (!first)
      putchar(',');
    first = 0;
    dspk__sub_json_strn(stdout, p, (size_t)(eq - p));
    putchar(':');
    p = eq + 2;
    {
      /* The value unescaped (\\, \", \n), then escaped as JSON: whatever
       * bytes it holds, the JSON stays valid and inert. */
      char *v = malloc(strlen(p) + 1);
      size_t n = 0;
      if (!v)
        return NULL;
      for (; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1]) {
          p++;
          v[n++] = *p == 'n' ? '\n' : *p;
        } else {
          v[n++] = *p;
        }
      }
      dspk__sub_json_strn(stdout, v, n);
      free(v);
    }
    if (*p != '"')
      return NULL;
    p++;
    if (*p == ',')
      p++;
  }
  putchar('}');
  return *p == '}' ? p + 1 : NULL;
}

static int print_json(const char *text) {
  int n = 0;
  printf("[");
  for (const char *line = text; *line;) {
    const char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    if (len && line[0] != '#') {
      size_t nl = strcspn(line, "{ ");
      const char *p = line + nl;
      printf("%s\n{\"name\":", n++ ? "," : "");
      dspk__sub_json_strn(stdout, line, nl);
      printf(",\"labels\":");
      if (*p == '{') {
        p = json_labels(p + 1);
        if (!p)
          return -1;
      } else {
        printf("{}");
      }
      while (*p == ' ')
        p++;
      /* Prometheus writes +Inf, -Inf and NaN, which JSON has no numbers for. */
      if (strncmp(p, "NaN", 3) == 0 || strncmp(p, "+Inf", 4) == 0 ||
          strncmp(p, "-Inf", 4) == 0) {
        printf(",\"value\":\"%.*s\"}", (int)strcspn(p, " \n"), p);
      } else {
        printf(",\"value\":%.*s}", (int)strcspn(p, " \n"), p);
      }
    }
    line += len + (eol != NULL);
  }
  printf("\n]\n");
  return 0;
}

int dspk__sub_metrics(dspk__sub_ctx *ctx, int argc, char **argv) {
  bool json = false;
  char *text = NULL;
  int rc = dspk__sub_json_connect(ctx, argc, argv, &json);

  if (rc >= 0)
    return rc;
  rc = dspk_metrics(ctx->client, &text);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  if (!json) {
    /* Line by line, escaped as every daemon text is (escape.h). */
    for (char *line = text, *eol; *line; line = eol ? eol + 1 : line + strlen(line)) {
      eol = strchr(line, '\n');
      if (eol)
        *eol = '\0';
      dspk__sub_put(stdout, line, DSPK__SUB_ESC_TEXT);
      putchar('\n');
      if (!eol)
        break;
    }
  } else if (print_json(text) != 0) {
    dspk_free(text);
    return dspk__sub_fail(ctx, DSPK_EPROTO, "the daemon's metrics text does not parse");
  }
  dspk_free(text);
  return DSPK__SUB_EXIT_OK;
}
