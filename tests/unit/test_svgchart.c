/* test_svgchart.c — common/svgchart.h, parsed back: XML escaping of every special character,
 * one polyline per series with more than one finite point (NaN/Inf points left out), a dot
 * for a lone point, series without points skipped, "no data" for an empty chart, and the
 * points mapped inside the plot box with the y axis pointing up (a higher value is drawn
 * higher). The status page and `dipacoctl job plot` draw with it. */
#include "common/svgchart.h"
#include "tests/unit/test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What f wrote, NUL-terminated (caller frees). */
static char *render(const dpc_svg_series *s, int ns, const char *title) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  dpc_svg_chart(f, 0, 0, 400, 200, s, ns, title, "x <axis>", "y & loss");
  fclose(f);
  return buf;
}

static int count(const char *h, const char *needle) {
  int n = 0;
  for (const char *p = h; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* The (x, y) pairs of the k-th polyline's points attribute; returns how many. */
static int polyline_points(const char *svg, int k, double *xy, int max) {
  const char *p = svg;
  for (int i = 0; i <= k; i++)
    if (!(p = strstr(p, "<polyline")) || !(p = strstr(p, "points=\""))) return -1;
  p += 8;
  int n = 0;
  while (*p != '"' && n < max) {
    char *end;
    xy[2 * n] = strtod(p, &end);
    if (*end != ',') return -1;
    xy[2 * n + 1] = strtod(end + 1, &end);
    n++;
    while (*end == ' ') end++;
    p = end;
  }
  return n;
}

int main(void) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  dpc_xml_escape(f, "a<b>&\"c'd");
  fclose(f);
  CHECK(strcmp(buf, "a&lt;b&gt;&amp;&quot;c&#39;d") == 0);
  free(buf);

  const double x1[] = {0, 10, 20, 30}, y1[] = {4, NAN, 2, 1};
  const double x2[] = {5}, y2[] = {3};
  const double x3[] = {1, 2}, y3[] = {INFINITY, NAN};
  dpc_svg_series s[3] = {{x1, y1, 4, "path <0>"}, {x2, y2, 1, "path 1"}, {x3, y3, 2, "empty"}};
  char *svg = render(s, 3, "job 1 a&b");
  CHECK_EQ_INT(count(svg, "<polyline"), 1);
  CHECK_EQ_INT(count(svg, "<circle"), 1);
  CHECK(strstr(svg, "path &lt;0&gt;") != NULL && strstr(svg, "path <0>") == NULL);
  CHECK(strstr(svg, "job 1 a&amp;b") && strstr(svg, "x &lt;axis&gt;") && strstr(svg, "y &amp; loss"));
  CHECK(strstr(svg, ">empty<") == NULL); /* no legend entry for a series with no point */
  CHECK(strstr(svg, "nan") == NULL && strstr(svg, "inf") == NULL);
  double xy[16];
  int np = polyline_points(svg, 0, xy, 8);
  CHECK_EQ_INT(np, 3); /* the NaN point is left out */
  if (np == 3) {
    for (int i = 0; i < 3; i++) CHECK(xy[2 * i] >= 0 && xy[2 * i] <= 400 && xy[2 * i + 1] >= 0 && xy[2 * i + 1] <= 200);
    CHECK(xy[0] < xy[2] && xy[2] < xy[4]);         /* x = 0, 20, 30 left to right */
    CHECK(xy[1] < xy[3] && xy[3] < xy[5]);         /* y = 4, 2, 1: lower values further down */
    CHECK_NEAR((xy[2] - xy[0]) / (xy[4] - xy[2]), 2.0, 1e-2); /* linear in x */
  }
  free(svg);

  svg = render(NULL, 0, NULL);
  CHECK(strstr(svg, "no data") != NULL && count(svg, "<polyline") == 0);
  free(svg);
  TEST_DONE();
}
