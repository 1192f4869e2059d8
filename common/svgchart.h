/* svgchart.h — a small line chart as SVG markup, self-contained (no script, no external
 * asset): what the coordinator's status page (loss per path) and `dipacoctl job plot` draw.
 * Axes with five ticks each, one polyline per series (a lone point as a dot), a legend.
 * Every text (labels, series names) is escaped with dpc_xml_escape. Thread-safe (writes only
 * to the caller's FILE). */
#ifndef DPC_SVGCHART_H
#define DPC_SVGCHART_H

#include <stdio.h>

typedef struct {
  const double *x, *y; /* (n) points, in drawing order */
  int n;
  const char *label;   /* legend text (escaped on output) */
} dpc_svg_series;

/* Text for XML/HTML content and attribute values: & < > " ' escaped. */
void dpc_xml_escape(FILE *f, const char *s);
/* The colour of series i (a fixed palette of 8, repeated). */
const char *dpc_svg_color(int i);
/* Write a chart as one <g> element placed at (ox, oy), w x h user units, inside an <svg> the
 * caller opens and closes. Series with no finite point are skipped; with no point at all the
 * chart says "no data". */
void dpc_svg_chart(FILE *f, double ox, double oy, double w, double h, const dpc_svg_series *s, int ns,
                   const char *title, const char *xlabel, const char *ylabel);

#endif
