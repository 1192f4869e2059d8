/* jobspec_doc.h — docs/jobspec.md, rendered from the job spec's field table (jobspec_fields.h).
 * tests/unit/jobspec_doc.c writes it; the test jobspec_doc compares it with the checked-in file. */
#ifndef DPC_JOBSPEC_DOC_H
#define DPC_JOBSPEC_DOC_H

/* The markdown of docs/jobspec.md into *out (malloc'd, the caller frees it); DPC_ENOMEM. */
int jobspec_doc_markdown(char **out);

/* The example spec the page shows (test_jobspec checks that it parses). */
extern const char jobspec_doc_example[];

#endif
