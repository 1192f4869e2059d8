#!/usr/bin/env python3
"""resources_memory.py — the coordinator's memory budget, against a real dipaco-coordinator over
python grpcio: with --memory-budget-mb 64, CreateJob of a model whose estimated coordinator
memory (~16M parameters: ~130 MiB) exceeds the budget is refused with RESOURCE_EXHAUSTED and a
message naming the estimate and the budget, before anything is allocated or stored; a small
model is still accepted and the coordinator stays up.

usage: resources_memory.py <dipaco-coordinator> <proto dir>"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_kit import Daemon, check, grpc_stubs, run_grpc_test, status_of  # noqa: E402


def spec(name, n_layer, n_head, n_embd, vocab):
    return {"name": name, "model": {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "n_positions": 64,
                                    "vocab_size": vocab, "seed": 3},
            "data": {"train": ["train/*.bin"]}, "algorithm": "diloco", "replicas": 2,
            "inner_steps": 3, "rounds": 4, "batch": 2, "seq_len": 8,
            "inner": {"lr": 0.001}, "outer": {"lr": 0.5, "momentum": 0.8}}


def body(coord_bin):
    def run(grpc, np, pb, d, state, log):
        d[0].stop()
        d[0] = Daemon(coord_bin, state, log, args=("--lease-ttl-ms", "30000", "--heartbeat-ms", "200",
                                                    "--memory-budget-mb", "64"))
        u = grpc_stubs(grpc, pb, d[0].addr, state)
        big = spec("big", 4, 4, 256, 50257)
        code, detail = status_of(grpc, u["CreateJob"], pb.CreateJobRequest(name="big", spec_json=json.dumps(big)),
                                 timeout=60)
        check(code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"a model over the budget: RESOURCE_EXHAUSTED ({code})")
        check(isinstance(detail, str) and "MiB" in detail and "64 MiB" in detail and "--memory-budget-mb" in detail,
              f"the message names the estimate and the budget ({detail})")
        r = u["ListJobs"](pb.ListJobsRequest(), timeout=10)
        check(len(r.jobs) == 0, "nothing was stored for the refused job")
        small = spec("small", 1, 2, 16, 64)
        code, j = status_of(grpc, u["CreateJob"], pb.CreateJobRequest(name="small", spec_json=json.dumps(small)),
                            timeout=60)
        check(code == grpc.StatusCode.OK and j.summary.job_id > 0, f"a small model is accepted ({code})")
        check(d[0].proc.poll() is None, "the coordinator is still up")
        with open(log) as f:
            check("memory budget for jobs: 64 MiB" in f.read(), "the log states the budget")
    return run


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    return run_grpc_test(sys.argv[1], sys.argv[2], "dpc_res_memory_", body(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
