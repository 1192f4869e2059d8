/* test_store.c — the SQLite store: schema creation and idempotent migration on reopen, the
 * job / worker / lease / delta / round / outer-commit lifecycle, idempotent delta recording,
 * transactions that fail midway (injected step failures) leaving nothing behind, GC, metrics,
 * and a reopen after close that finds everything where it was. */
#include "common/errors.h"
#include "coordinator/store.h"
#include "tests/unit/test.h"

#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

static const char *SPEC =
    "{\"name\":\"job-a\",\"model\":{\"n_layer\":2,\"n_head\":2,\"n_embd\":8,\"n_positions\":16,\"vocab_size\":32},"
    "\"data\":{\"train\":[\"t.bin\"]},\"algorithm\":\"dipaco\",\"replicas\":2,\"inner_steps\":4,\"rounds\":3,"
    "\"batch\":2,\"seq_len\":8,\"levels\":[{\"stem\":true,\"layers\":[0,0]},{\"layers\":[0,2],\"modules\":2}]}";

/* Count rows with a raw query through a second connection (independent of the store API). */
static long count_rows(const char *dir, const char *sql) {
  char path[256];
  snprintf(path, sizeof path, "%s/dipaco.db", dir);
  sqlite3 *db;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return -1;
  sqlite3_stmt *s;
  long n = -1;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK) {
    if (sqlite3_step(s) == SQLITE_ROW) n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  return n;
}

typedef struct {
  jobspec js;
  gpt_layout lay;
  jobspec_module mods[8];
  jobspec_fragment frags[8];
  store_fragment_init init[8];
  char names[8][BLOB_NAME_MAX];
  char *json;
  int nm, nf;
} job_fixture;

static void make_job(job_fixture *f, const char *spec, int64_t id) {
  CHECK_EQ_INT(jobspec_parse(spec, strlen(spec), &f->js), 0);
  CHECK_EQ_INT(jobspec_layout(&f->js, &f->lay), 0);
  f->nm = jobspec_modules(&f->js, &f->lay, f->mods, 8);
  f->nf = jobspec_fragments(&f->js, &f->lay, f->frags, 8);
  CHECK_EQ_INT(jobspec_to_json(&f->js, &f->json), 0);
  for (int i = 0; i < f->nf; i++) {
    blob_id b = {.job = id, .fragment = f->frags[i].id, .version = 0, .kind = BLOB_PARAMS};
    blob_name(&b, f->names[i], sizeof f->names[i]);
    f->init[i] = (store_fragment_init){.fragment = f->frags[i].id, .param_blob = f->names[i], .param_crc = 100u + (uint32_t)i};
  }
}

static store_new_job new_job(job_fixture *f, int64_t id) {
  return (store_new_job){.id = id, .spec = &f->js, .spec_json = f->json, .modules = f->mods, .n_modules = f->nm,
                         .fragments = f->frags, .n_fragments = f->nf, .init = f->init, .now_ms = 1000};
}

int main(void) {
  char dir[] = "/tmp/dpc_store_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  store *st;
  CHECK_EQ_INT(store_open(dir, &st), 0);
  int v = -1;
  CHECK_EQ_INT(store_schema_version(st, &v), 0);
  CHECK_EQ_INT(v, STORE_SCHEMA_VERSION);
  store_close(st);
  /* Reopen: migration is idempotent (no second history row, same version), WAL is on. */
  CHECK_EQ_INT(store_open(dir, &st), 0);
  CHECK_EQ_INT(store_schema_version(st, &v), 0);
  CHECK_EQ_INT(v, STORE_SCHEMA_VERSION);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM migrations"), STORE_SCHEMA_VERSION);
  {
    char path[256];
    snprintf(path, sizeof path, "%s/dipaco.db", dir);
    sqlite3 *db;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    sqlite3_stmt *s;
    CHECK(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(s) == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(s, 0), "wal") == 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
  }

  /* Create a DiPaCo job: stem + level of 2 modules → 3 fragments, 2 paths × 2 replicas. */
  static job_fixture fx, fx2;
  int64_t jid = 0;
  CHECK_EQ_INT(store_next_job_id(st, &jid), 0);
  CHECK_EQ_INT(jid, 1);
  make_job(&fx, SPEC, jid);
  CHECK_EQ_INT(fx.nf, 3);

  /* A transaction failing midway (the 9th step: inside the fragment inserts) leaves nothing. */
  store_new_job nj = new_job(&fx, jid);
  for (int fail_at = 2; fail_at <= 20; fail_at += 6) {
    store_debug_fail_step(st, fail_at);
    CHECK_EQ_INT(store_create_job(st, &nj), DPC_EIO);
    CHECK(strstr(dpc_errmsg(), "injected") != NULL);
    CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM jobs"), 0);
    CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM fragments"), 0);
    CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM slots"), 0);
  }
  store_debug_fail_step(st, 0);
  CHECK_EQ_INT(store_create_job(st, &nj), 0);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM fragments"), 3);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM fragment_versions"), 3);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM paths"), 2);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM path_modules"), 4);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM slots WHERE state = 'idle'"), 4);
  /* Same name again: refused. */
  make_job(&fx2, SPEC, 2);
  store_new_job nj2 = new_job(&fx2, 2);
  CHECK_EQ_INT(store_create_job(st, &nj2), DPC_EEXIST);
  CHECK(strstr(dpc_errmsg(), "job-a") != NULL);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM jobs"), 1);

  store_job job;
  CHECK_EQ_INT(store_get_job(st, jid, &job), 0);
  CHECK(strcmp(job.name, "job-a") == 0);
  CHECK_EQ_INT(job.state, JOB_CREATED);
  CHECK_EQ_INT(job.algorithm, JOB_ALGO_DIPACO);
  CHECK(job.spec_json && strcmp(job.spec_json, fx.json) == 0);
  store_job_clear(&job);
  CHECK_EQ_INT(store_find_job(st, "nope", &job), DPC_ENOENT);
  CHECK_EQ_INT(store_set_job_state(st, jid, JOB_RUNNING, NULL, 2000), 0);

  store_fragment fr;
  CHECK_EQ_INT(store_get_fragment(st, jid, 1, &fr), 0);
  CHECK_EQ_INT(fr.version, 0);
  CHECK_EQ_INT(fr.round, -1);
  CHECK_EQ_INT(fr.module, 1);
  CHECK_EQ_INT(fr.offset, fx.lay.layer_off[0]);
  CHECK_EQ_INT(fr.len, fx.lay.n_params - fx.lay.layer_off[0]);
  CHECK(strcmp(fr.param_blob, "1/f1-v0.params") == 0);
  CHECK_EQ_INT(fr.param_crc, 101);
  CHECK(fr.momentum_blob[0] == '\0');

  /* Workers. */
  unsigned char tok[STORE_TOKEN_HASH_BYTES];
  for (int i = 0; i < STORE_TOKEN_HASH_BYTES; i++) tok[i] = (unsigned char)(i * 7);
  int64_t w1, w2;
  CHECK_EQ_INT(store_register_worker(st, "gpu-1", tok, "cuda H100", 1500, &w1), 0);
  CHECK_EQ_INT(store_register_worker(st, "cpu-2", tok, NULL, 1500, &w2), 0);
  CHECK_EQ_INT(store_touch_worker(st, w1, 1600, 12.5), 0);
  CHECK_EQ_INT(store_touch_worker(st, w1, 1700, NAN), 0);
  CHECK_EQ_INT(store_touch_worker(st, 999, 1700, 1.0), DPC_ENOENT);
  store_worker wk;
  CHECK_EQ_INT(store_get_worker(st, w1, &wk), 0);
  CHECK_EQ_INT(wk.last_seen, 1700);
  CHECK(wk.steps_per_s == 12.5);
  CHECK(memcmp(wk.token_hash, tok, sizeof tok) == 0);
  CHECK(strcmp(wk.info, "cuda H100") == 0);
  /* Liveness is batched: the row (another connection's view) keeps the old value until a
   * flush; readers through the store see the new one at once. */
  CHECK_EQ_INT(count_rows(dir, "SELECT last_seen FROM workers WHERE id = 1"), 1500);
  store_worker *wl = NULL;
  int nwl = 0;
  CHECK_EQ_INT(store_list_workers(st, &wl, &nwl), 0);
  CHECK(nwl == 2 && wl[0].id == w1 && wl[0].last_seen == 1700 && wl[0].steps_per_s == 12.5);
  free(wl);
  CHECK_EQ_INT(store_flush_liveness(st), 0);
  CHECK_EQ_INT(count_rows(dir, "SELECT last_seen FROM workers WHERE id = 1"), 1700);
  CHECK_EQ_INT(count_rows(dir, "SELECT CAST(steps_per_s * 10 AS INTEGER) FROM workers WHERE id = 1"), 125);
  CHECK_EQ_INT(store_touch_worker(st, w1, 1650, -1), 0); /* never moves back */
  CHECK_EQ_INT(store_get_worker(st, w1, &wk), 0);
  CHECK_EQ_INT(wk.last_seen, 1700);

  /* Leases on path 1 (modules 0 and 2 → fragments 0 and 2). */
  int frs[2] = {0, 2};
  int64_t bases[2] = {0, 0};
  store_new_lease nl = {.job = jid, .path = 1, .replica = 0, .worker = w1, .round = 0, .inner_steps = 4,
                        .step_begin = 0, .n_fragments = 2, .fragments = frs, .base_versions = bases,
                        .now_ms = 2000, .expires_at = 5000};
  int64_t l1, l2, l3;
  CHECK_EQ_INT(store_create_lease(st, &nl, &l1), 0);
  CHECK_EQ_INT(store_create_lease(st, &nl, &l2), DPC_ESTATE); /* slot already leased */
  nl.replica = 1;
  nl.worker = w2;
  nl.expires_at = 3000;
  CHECK_EQ_INT(store_create_lease(st, &nl, &l2), 0);
  nl.worker = 999;
  nl.replica = 0;
  nl.path = 0;
  CHECK_EQ_INT(store_create_lease(st, &nl, &l3), DPC_ENOENT);
  store_slot sl;
  CHECK_EQ_INT(store_get_slot(st, jid, 1, 0, &sl), 0);
  CHECK_EQ_INT(sl.state, SLOT_LEASED);
  CHECK_EQ_INT(sl.last_worker, w1);
  CHECK_EQ_INT(store_set_slot_state(st, jid, 1, 0, SLOT_DONE), DPC_ESTATE);
  CHECK_EQ_INT(store_renew_lease(st, l1, w2, 9000), DPC_EPERM);
  CHECK_EQ_INT(store_renew_lease(st, l1, w1, 9000), 0);
  {
    /* A renewal is seen at once through the store, durable after the next expiry pass. */
    store_lease lr;
    CHECK_EQ_INT(store_get_lease(st, l1, &lr), 0);
    CHECK_EQ_INT(lr.expires_at, 9000);
    CHECK_EQ_INT(count_rows(dir, "SELECT expires_at FROM leases WHERE id = 1"), 5000);
  }
  int64_t bv = -1;
  CHECK_EQ_INT(store_lease_base_version(st, l1, 2, &bv), 0);
  CHECK_EQ_INT(bv, 0);
  CHECK_EQ_INT(store_lease_base_version(st, l1, 1, &bv), DPC_ENOENT);

  /* Expiry: l2 (expires 3000) goes at now = 4000, l1 (renewed to 9000) stays. */
  int64_t *expired = NULL;
  int nexp = 0;
  CHECK_EQ_INT(store_expire_leases(st, 4000, &expired, &nexp), 0);
  CHECK_EQ_INT(nexp, 1);
  CHECK(expired && expired[0] == l2);
  free(expired);
  CHECK_EQ_INT(count_rows(dir, "SELECT expires_at FROM leases WHERE id = 1"), 9000);
  store_lease le;
  CHECK_EQ_INT(store_get_lease(st, l2, &le), 0);
  CHECK_EQ_INT(le.state, LEASE_EXPIRED);
  CHECK_EQ_INT(store_get_slot(st, jid, 1, 1, &sl), 0);
  CHECK_EQ_INT(sl.state, SLOT_IDLE);
  CHECK_EQ_INT(sl.round, 0);
  CHECK_EQ_INT(store_renew_lease(st, l2, w2, 9000), DPC_ESTATE);
  /* The slot is leased again (replica 1 of path 1) by w2. */
  nl.path = 1;
  nl.replica = 1;
  nl.worker = w2;
  nl.expires_at = 9000;
  CHECK_EQ_INT(store_create_lease(st, &nl, &l3), 0);
  store_lease *act = NULL;
  int nact = 0;
  CHECK_EQ_INT(store_list_active_leases(st, jid, &act, &nact), 0);
  CHECK_EQ_INT(nact, 2);
  free(act);

  /* Round 0 of fragment 2; deltas arrive in the "wrong" order (replica 1 first). */
  CHECK_EQ_INT(store_open_round(st, jid, 2, 0, 2000, 60000), 0);
  CHECK_EQ_INT(store_open_round(st, jid, 2, 0, 2500, 1), 0); /* idempotent: unchanged */
  store_round rd;
  CHECK_EQ_INT(store_get_round(st, jid, 2, 0, &rd), 0);
  CHECK_EQ_INT(rd.deadline_at, 60000);
  CHECK_EQ_INT(rd.state, ROUND_OPEN);
  /* l3's delta was quantized: its stream as sent is kept beside it (replay pulls). */
  store_new_delta nd = {.lease = l3, .fragment = 2, .checksum = 0xabcdef01u, .blob = "1/f2-v0-a3.delta",
                        .enc_blob = "1/f2-v0-a3.encoded", .enc_crc = 0x5a5a5a5au, .weight = 1.0, .tokens = 64,
                        .now_ms = 6000, .norm = 2.5};
  int64_t d3, d1, dd;
  CHECK_EQ_INT(store_record_delta(st, &nd, &d3), 0);
  CHECK_EQ_INT(store_record_delta(st, &nd, &dd), 1); /* retry: already had it */
  CHECK_EQ_INT(dd, d3);
  /* l2 expired (its slot went to l3): a delta of it does not count, though the round is open. */
  store_new_delta nd2 = nd;
  nd2.lease = l2;
  nd2.blob = "1/f2-v0-a2.delta";
  CHECK_EQ_INT(store_record_delta(st, &nd2, NULL), DPC_ECANCELED);
  nd.checksum = 0x12345678u;
  CHECK_EQ_INT(store_record_delta(st, &nd, &dd), DPC_EEXIST);
  nd.fragment = 1; /* not on path 1 */
  CHECK_EQ_INT(store_record_delta(st, &nd, &dd), DPC_ENOENT);
  nd.lease = 12345;
  CHECK_EQ_INT(store_record_delta(st, &nd, &dd), DPC_ENOENT);
  nd2.enc_blob = NULL;
  nd = (store_new_delta){.lease = l1, .fragment = 2, .checksum = 7, .blob = "1/f2-v0-a1.delta", .weight = 2.0,
                         .tokens = 64, .now_ms = 6100, .norm = NAN};
  /* An injected failure inside record_delta leaves no row; the retry then records it. */
  store_debug_fail_step(st, 4);
  CHECK(store_record_delta(st, &nd, &d1) < 0);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM deltas"), 1);
  CHECK_EQ_INT(store_record_delta(st, &nd, &d1), 0);
  nd.fragment = 0;
  nd.blob = "1/f0-v0-a1.delta";
  CHECK_EQ_INT(store_record_delta(st, &nd, NULL), 0);
  {
    /* Indexed lookups of the push path: a lease's delta of a fragment, and the slots that
     * have a received delta in a round (l1 and l3 pushed fragment 2 of round 0). */
    uint32_t crc = 0;
    CHECK_EQ_INT(store_find_delta(st, l3, 2, &crc, NULL), 1);
    CHECK_EQ_INT(crc, 0xabcdef01u);
    CHECK_EQ_INT(store_find_delta(st, l3, 1, NULL, NULL), 0);
    int ns_ = -1;
    CHECK_EQ_INT(store_count_received_slots(st, jid, 2, 0, &ns_), 0);
    CHECK_EQ_INT(ns_, 2);
    CHECK_EQ_INT(store_count_received_slots(st, jid, 2, 1, &ns_), 0);
    CHECK_EQ_INT(ns_, 0);
  }
  {
    /* The norm screen's memory: the recorded norms of (job, fragment), oldest first; a delta
     * recorded without a norm (NaN) has none. */
    double norms[4];
    int nn = -1;
    CHECK_EQ_INT(store_delta_norms(st, jid, 2, 4, norms, &nn), 0);
    CHECK_EQ_INT(nn, 1);
    CHECK(nn == 1 && norms[0] == 2.5);
  }
  store_delta *ds = NULL;
  int nds = 0;
  CHECK_EQ_INT(store_list_deltas(st, jid, 2, 0, DELTA_RECEIVED, &ds, &nds), 0);
  CHECK_EQ_INT(nds, 2);
  CHECK(ds && ds[0].id == d1 && ds[0].replica == 0 && ds[1].id == d3 && ds[1].replica == 1); /* fixed order */
  CHECK(ds && ds[0].weight == 2.0 && ds[0].base_version == 0 && ds[0].path == 1);
  CHECK(ds && strcmp(ds[1].blob, "1/f2-v0-a3.delta") == 0 && ds[1].checksum == 0xabcdef01u);
  CHECK(ds && strcmp(ds[1].enc_blob, "1/f2-v0-a3.encoded") == 0 && ds[1].enc_crc == 0x5a5a5a5au);
  CHECK(ds && ds[0].enc_blob[0] == 0 && ds[0].enc_crc == 0);
  free(ds);

  CHECK_EQ_INT(store_list_pending_deltas(st, jid, 2, &ds, &nds), 0);
  CHECK_EQ_INT(nds, 2);
  CHECK(ds && ds[0].id == d1);
  free(ds);
  {
    int *lf = NULL;
    int64_t *lv = NULL;
    int nlf = 0;
    CHECK_EQ_INT(store_lease_fragments(st, l1, &lf, &lv, &nlf), 0);
    CHECK_EQ_INT(nlf, 2);
    CHECK(lf && lv && lf[0] == 0 && lf[1] == 2 && lv[1] == 0);
    free(lf);
    free(lv);
  }

  /* Outer step: wrong version / foreign delta refused atomically, then the real commit. */
  int64_t applied[2] = {d1, d3};
  store_outer_commit oc = {.job = jid, .fragment = 2, .round = 0, .new_version = 2, .param_blob = "1/f2-v1.params",
                           .param_crc = 11, .momentum_blob = "1/f2-v1.momentum", .momentum_crc = 12,
                           .applied = applied, .n_applied = 2, .close_round = 1, .now_ms = 7000};
  CHECK_EQ_INT(store_commit_outer(st, &oc), DPC_ESTATE);
  oc.new_version = 1;
  int64_t wrong[2] = {d1, d1 + 1}; /* d1 + 1 is fragment 0's delta */
  oc.applied = wrong;
  CHECK_EQ_INT(store_commit_outer(st, &oc), DPC_ESTATE);
  CHECK_EQ_INT(store_get_fragment(st, jid, 2, &fr), 0);
  CHECK_EQ_INT(fr.version, 0);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM deltas WHERE state = 'received'"), 3);
  oc.applied = applied;
  store_debug_fail_step(st, 6);
  CHECK_EQ_INT(store_commit_outer(st, &oc), DPC_EIO);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM fragment_versions WHERE fragment = 2"), 1);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM deltas WHERE state = 'applied'"), 0);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM rounds WHERE state = 'closed'"), 0);
  CHECK_EQ_INT(store_commit_outer(st, &oc), 0);
  CHECK_EQ_INT(store_get_fragment(st, jid, 2, &fr), 0);
  CHECK_EQ_INT(fr.version, 1);
  CHECK_EQ_INT(fr.round, 0);
  CHECK(strcmp(fr.momentum_blob, "1/f2-v1.momentum") == 0);
  CHECK_EQ_INT(store_get_round(st, jid, 2, 0, &rd), 0);
  CHECK_EQ_INT(rd.state, ROUND_CLOSED);
  CHECK_EQ_INT(rd.n_deltas, 2);
  CHECK_EQ_INT(rd.version, 1);
  store_delta dl;
  CHECK_EQ_INT(store_get_delta(st, d1, &dl), 0);
  CHECK_EQ_INT(dl.state, DELTA_APPLIED);
  CHECK_EQ_INT(store_list_pending_deltas(st, jid, 2, &ds, &nds), 0);
  CHECK_EQ_INT(nds, 0);
  free(ds);
  CHECK_EQ_INT(dl.applied_version, 1);
  CHECK_EQ_INT(store_commit_outer(st, &oc), DPC_ESTATE); /* version now 1: v1 again is stale */
  /* A late delta for the closed round is refused; a retry of an applied one still acks. */
  nd = (store_new_delta){.lease = l3, .fragment = 2, .checksum = 0xabcdef01u, .blob = "1/f2-v0-a3.delta",
                         .weight = 1.0, .tokens = 64, .now_ms = 7100};
  CHECK_EQ_INT(store_record_delta(st, &nd, NULL), 1);
  nd.fragment = 0;
  nd.blob = "1/f0-v0-a3.delta";
  CHECK_EQ_INT(store_open_round(st, jid, 0, 0, 2000, 0), 0);
  int64_t only_d = d1 + 1;
  store_outer_commit oc0 = {.job = jid, .fragment = 0, .round = 0, .new_version = 1, .param_blob = "1/f0-v1.params",
                            .applied = &only_d, .n_applied = 1, .close_round = 1, .now_ms = 7200};
  CHECK_EQ_INT(store_commit_outer(st, &oc0), 0);
  CHECK_EQ_INT(store_record_delta(st, &nd, NULL), DPC_ESTATE);
  CHECK(strstr(dpc_errmsg(), "too late") != NULL);

  /* Finishing the lease advances the slot. */
  CHECK_EQ_INT(store_end_lease(st, l1, LEASE_FINISHED, 1, 4, 7300), 0);
  CHECK_EQ_INT(store_end_lease(st, l1, LEASE_FINISHED, 1, 4, 7300), DPC_ESTATE);
  CHECK_EQ_INT(store_get_slot(st, jid, 1, 0, &sl), 0);
  CHECK_EQ_INT(sl.state, SLOT_IDLE);
  CHECK_EQ_INT(sl.round, 1);
  CHECK_EQ_INT(sl.inner_steps, 4);
  CHECK_EQ_INT(store_end_lease(st, l3, LEASE_RELEASED, 0, 0, 7300), 0);

  /* More versions of fragment 2, then GC keeping the last 2 and every 4th. */
  for (int64_t ver = 2; ver <= 9; ver++) {
    char pb[64], mb[64];
    snprintf(pb, sizeof pb, "1/f2-v%lld.params", (long long)ver);
    snprintf(mb, sizeof mb, "1/f2-v%lld.momentum", (long long)ver);
    store_outer_commit c = {.job = jid, .fragment = 2, .round = ver - 1, .new_version = ver, .param_blob = pb,
                            .momentum_blob = mb, .close_round = 1, .now_ms = 8000 + ver};
    CHECK_EQ_INT(store_commit_outer(st, &c), 0);
  }
  char **names = NULL;
  int nnames = 0;
  CHECK_EQ_INT(store_gc_versions(st, jid, 2, 2, 4, &names, &nnames), 0);
  /* Versions 0..9, keep 8, 9 (last 2), 0 (initial, keep flag) and 4 (multiple of 4):
   * collected 1, 2, 3, 5, 6, 7 with two blobs each. */
  CHECK_EQ_INT(nnames, 12);
  CHECK(names && strcmp(names[0], "1/f2-v1.params") == 0 && strcmp(names[1], "1/f2-v1.momentum") == 0);
  store_names_free(names, nnames);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM fragment_versions WHERE fragment = 2"), 4);
  CHECK_EQ_INT(store_get_version(st, jid, 2, 4, &fr), 0);
  CHECK_EQ_INT(store_get_version(st, jid, 2, 5, &fr), DPC_ENOENT);
  /* The start-up sweep keeps what rows name: the stream as sent too. */
  CHECK_EQ_INT(store_blob_names(st, &names, &nnames), 0);
  int listed = 0;
  for (int i = 0; i < nnames; i++) listed += strcmp(names[i], "1/f2-v0-a3.encoded") == 0;
  CHECK_EQ_INT(listed, 1);
  store_names_free(names, nnames);
  CHECK_EQ_INT(store_gc_deltas(st, jid, 2, 1, &names, &nnames), 0);
  CHECK_EQ_INT(nnames, 3); /* the two deltas and the one's stream as sent */
  int enc_named = 0;
  for (int i = 0; i < nnames; i++) enc_named += strcmp(names[i], "1/f2-v0-a3.encoded") == 0;
  CHECK_EQ_INT(enc_named, 1);
  store_names_free(names, nnames);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM deltas WHERE enc_blob != ''"), 0);
  /* The rows stay as the ledger, without their blobs; a second pass has nothing to collect. */
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM deltas WHERE fragment = 2 AND blob = ''"), 2);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM deltas WHERE fragment = 2 AND blob != ''"), 0);
  CHECK_EQ_INT(store_gc_deltas(st, jid, 2, 1, &names, &nnames), 0);
  CHECK_EQ_INT(nnames, 0);
  store_names_free(names, nnames);

  /* Metrics. */
  store_metric m = {.job = jid, .round = 0, .path = 1, .replica = 0, .worker = w1, .loss = 3.5, .tokens = 64,
                    .bytes_in = 100, .bytes_out = 200, .outer_seconds = 0.01, .created_at = 7000};
  CHECK_EQ_INT(store_add_metric(st, &m), 0);
  m.round = 1;
  m.loss = NAN;
  CHECK_EQ_INT(store_add_metric(st, &m), 0);
  store_metric *ms = NULL;
  int nms = 0;
  CHECK_EQ_INT(store_list_metrics(st, jid, 1, &ms, &nms), 0);
  CHECK_EQ_INT(nms, 1);
  CHECK(ms && isnan(ms[0].loss) && ms[0].bytes_out == 200);
  free(ms);

  /* Terminal states stick. */
  CHECK_EQ_INT(store_set_job_state(st, jid, JOB_CANCELED, "user asked", 9000), 0);
  CHECK_EQ_INT(store_set_job_state(st, jid, JOB_RUNNING, NULL, 9100), DPC_ESTATE);

  /* Reopen: everything is where it was. */
  store_close(st);
  CHECK_EQ_INT(store_open(dir, &st), 0);
  CHECK_EQ_INT(count_rows(dir, "SELECT count(*) FROM migrations"), STORE_SCHEMA_VERSION);
  store_job *jobs = NULL;
  int nj_ = 0;
  CHECK_EQ_INT(store_list_jobs(st, &jobs, &nj_), 0);
  CHECK_EQ_INT(nj_, 1);
  CHECK(jobs && jobs[0].state == JOB_CANCELED && jobs[0].error && strcmp(jobs[0].error, "user asked") == 0);
  store_jobs_free(jobs, nj_);
  store_fragment *frs_ = NULL;
  int nfr = 0;
  CHECK_EQ_INT(store_list_fragments(st, jid, &frs_, &nfr), 0);
  CHECK_EQ_INT(nfr, 3);
  CHECK(frs_ && frs_[0].version == 1 && frs_[1].version == 0 && frs_[2].version == 9);
  free(frs_);
  store_worker *ws = NULL;
  int nws = 0;
  CHECK_EQ_INT(store_list_workers(st, &ws, &nws), 0);
  CHECK_EQ_INT(nws, 2);
  free(ws);
  store_slot *sls = NULL;
  int nsl = 0;
  CHECK_EQ_INT(store_list_slots(st, jid, &sls, &nsl), 0);
  CHECK_EQ_INT(nsl, 4);
  CHECK(sls && sls[2].path == 1 && sls[2].replica == 0 && sls[2].round == 1);
  free(sls);
  CHECK_EQ_INT(store_get_lease(st, l2, &le), 0);
  CHECK_EQ_INT(le.state, LEASE_EXPIRED);
  {
    /* A partial delta (async preemption: 3 of 4 steps) shortens its lease in the same
     * transaction, so the slot advances by the steps trained; more than leased changes
     * nothing. */
    int64_t l4;
    nl = (store_new_lease){.job = jid, .path = 1, .replica = 0, .worker = w1, .round = 50, .inner_steps = 4,
                           .step_begin = 4, .n_fragments = 2, .fragments = frs, .base_versions = bases,
                           .now_ms = 7400, .expires_at = 99000};
    CHECK_EQ_INT(store_create_lease(st, &nl, &l4), 0);
    nd = (store_new_delta){.lease = l4, .fragment = 2, .checksum = 11, .blob = "1/f2-v1-a4.delta", .weight = 1.0,
                           .tokens = 48, .now_ms = 7500, .inner_steps = 3};
    CHECK_EQ_INT(store_record_delta(st, &nd, NULL), 0);
    store_lease l4r;
    CHECK_EQ_INT(store_get_lease(st, l4, &l4r), 0);
    CHECK_EQ_INT(l4r.inner_steps, 3);
    nd.fragment = 0;
    nd.blob = "1/f0-v1-a4.delta";
    nd.inner_steps = 9;
    CHECK_EQ_INT(store_record_delta(st, &nd, NULL), 0);
    CHECK_EQ_INT(store_get_lease(st, l4, &l4r), 0);
    CHECK_EQ_INT(l4r.inner_steps, 3);
    CHECK_EQ_INT(store_end_lease(st, l4, LEASE_FINISHED, 1, l4r.inner_steps, 7600), 0);
    CHECK_EQ_INT(store_get_slot(st, jid, 1, 0, &sl), 0);
    CHECK_EQ_INT(sl.inner_steps, 7);
  }
  {
    /* The sync Lease candidates: the idle slots within a round range, in (path, replica)
     * order, equal to filtering the full slot list. */
    store_slot *all = NULL, *idle = NULL;
    int na_ = 0, ni = 0;
    CHECK_EQ_INT(store_list_slots(st, jid, &all, &na_), 0);
    for (int64_t lo = 0; lo <= 2; lo++) {
      int64_t hi = lo + 60;
      CHECK_EQ_INT(store_list_idle_slots(st, jid, lo, hi, &idle, &ni), 0);
      int k = 0, ok = 1;
      for (int i = 0; i < na_; i++)
        if (all[i].state == SLOT_IDLE && all[i].round >= lo && all[i].round <= hi)
          ok &= k < ni && idle[k].path == all[i].path && idle[k].replica == all[i].replica && idle[k++].round == all[i].round;
      CHECK(ok && k == ni);
      free(idle);
    }
    int64_t minr = INT64_MAX;
    for (int i = 0; i < na_; i++)
      if (all[i].round < minr) minr = all[i].round;
    CHECK_EQ_INT(store_any_slot_below(st, jid, minr), 0);
    CHECK_EQ_INT(store_any_slot_below(st, jid, minr + 1), 1);
    free(all);
  }
  CHECK_EQ_INT(store_next_job_id(st, &jid), 0);
  CHECK_EQ_INT(jid, 2);
  store_round *ors = NULL;
  int nor = 0;
  CHECK_EQ_INT(store_list_open_rounds(st, 0, &ors, &nor), 0);
  CHECK_EQ_INT(nor, 0);
  free(ors);
  store_close(st);

  /* A database from a newer build is refused. */
  {
    char path[256];
    snprintf(path, sizeof path, "%s/dipaco.db", dir);
    sqlite3 *db;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    CHECK_EQ_INT(store_open(dir, &st), DPC_EUNSUPPORTED);
    CHECK(strstr(dpc_errmsg(), "newer") != NULL);
  }
  free(fx.json);
  free(fx2.json);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
