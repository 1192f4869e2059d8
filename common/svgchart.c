/* svgchart.c — line charts as SVG markup (svgchart.h). The axes span the data's range (the
 * y range padded by 5%, a flat range widened), tick labels in %g form. */
#include "common/svgchart.h"

#include <math.h>

void dpc_xml_escape(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(*s, f);
    }
  }
}

const char *dpc_svg_color(int i) {
  static const char *const palette[8] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return palette[(i % 8 + 8) % 8];
}

void dpc_svg_chart(FILE *f, double ox, double oy, double w, double h, const dpc_svg_series *s, int ns,
                   const char *title, const char *xlabel, const char *ylabel) {
  const double L = 64, R = 30, T = title && title[0] ? 26 : 12, B = 40;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  int npts = 0;
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < s[k].n; i++) {
      if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
      x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
      y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
      npts++;
    }
  fprintf(f, "<g transform=\"translate(%.1f %.1f)\" font-family=\"sans-serif\">\n", ox, oy);
  if (title && title[0]) {
    fprintf(f, "<text x=\"%.1f\" y=\"16\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">", w / 2);
    dpc_xml_escape(f, title);
    fputs("</text>\n", f);
  }
  const double pw = w - L - R, ph = h - T - B;
  fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#fff\" stroke=\"#999\"/>\n", L, T, pw, ph);
  if (!npts) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"13\" fill=\"#777\">no data</text>\n</g>\n",
            L + pw / 2, T + ph / 2);
    return;
  }
  if (x1 - x0 <= 0) x0 -= 1, x1 += 1;
  if (y1 - y0 < 1e-9 * fmax(1, fabs(y0))) y0 -= 0.5, y1 += 0.5;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
#define SX(v) (L + ((v) - x0) / (x1 - x0) * pw)
#define SY(v) (T + (y1 - (v)) / (y1 - y0) * ph)
  for (int k = 0; k <= 4; k++) {
    const double yv = y0 + (y1 - y0) * k / 4, xv = x0 + (x1 - x0) * k / 4;
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
               "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\" fill=\"#555\">%.4g</text>\n",
            L, L + pw, SY(yv), SY(yv), L - 4, SY(yv) + 4, yv);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555\">%.4g</text>\n", SX(xv),
            T + ph + 14, xv);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">", L + pw / 2, h - 6);
  dpc_xml_escape(f, xlabel);
  fprintf(f, "</text>\n<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 14 %.1f)\">",
          T + ph / 2, T + ph / 2);
  dpc_xml_escape(f, ylabel);
  fputs("</text>\n", f);
  int shown = 0;
  for (int k = 0; k < ns; k++) {
    const char *col = dpc_svg_color(k);
    int m = 0;
    for (int i = 0; i < s[k].n; i++) m += isfinite(s[k].x[i]) && isfinite(s[k].y[i]);
    if (!m) continue;
    if (m == 1) {
      for (int i = 0; i < s[k].n; i++)
        if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
          fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", SX(s[k].x[i]), SY(s[k].y[i]), col);
    } else {
      fprintf(f, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2.5\" stroke-linejoin=\"round\" "
                 "points=\"", col);
      for (int i = 0; i < s[k].n; i++)
        if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) fprintf(f, "%.1f,%.1f ", SX(s[k].x[i]), SY(s[k].y[i]));
      fputs("\"/>\n", f);
    }
    /* legend: top right, one row per series */
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>"
               "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", L + pw - 90, T + 6 + 14 * shown, col, L + pw - 76,
            T + 15 + 14 * shown);
    dpc_xml_escape(f, s[k].label);
    fputs("</text>\n", f);
    shown++;
  }
#undef SX
#undef SY
  fputs("</g>\n", f);
}
