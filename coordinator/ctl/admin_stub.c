/* admin_stub.c — ctl_admin for a dipacoctl built without gRPC (DIPACO_DISTRIBUTED=OFF, or
 * without dpc_rpc/dpc_coord): every admin command says what is missing instead of failing
 * with "unknown command" alone. CMakeLists.txt builds this file or admin.c, never both. */
#include "coordinator/ctl/ctl.h"

#include <stdio.h>

int ctl_admin(const char *coordinator, int argc, char **argv) {
  (void)coordinator;
  (void)argc;
  fprintf(stderr,
          "dipacoctl: unknown command '%s'. This dipacoctl was built without the admin commands "
          "(DIPACO_DISTRIBUTED=OFF); run 'dipacoctl --help' for the offline tools.\n",
          argv[0]);
  return 2;
}
