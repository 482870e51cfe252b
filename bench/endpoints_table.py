#!/usr/bin/env python3
"""Tabulates bench/endpoints.sh's output: one row per measurement with its value per round,
then the rdmx / peer ratios per round with their range over the rounds (for latencies the
ratio is rdmx's time over the peer's, so above 1 is slower; for rates rdmx's over the
peer's, so below 1 is slower). A range that holds 1 is parity.

Usage: bench/endpoints_table.py RAW.txt
"""
import json
import re
import sys

# label -> (description, unit, how to read the value from the rest of the line)
def rdmx_key(key):
    return lambda rest: json.loads(rest)[key]


def fab(field):  # fabtests: bytes iters total time MB/sec usec/xfer Mxfers/sec
    return lambda rest: float(rest.split()[field])


def ucx(field):  # ucx_perftest "Final:" iters typical avg overall bw_avg bw_overall rate_avg rate_overall
    return lambda rest: float(rest.split()[field])


def fi_pp(rest):
    return float(rest.split()[0])


ROWS = [
    ("tag_lat_8B", "TCP rdmx endpoint 8 B tagged ping-pong, one way, median", "us", rdmx_key("lat_us")),
    ("tag_lat_8B_busy", "TCP rdmx endpoint 8 B ping-pong, `busy_poll`, one way, median", "us", rdmx_key("lat_us")),
    ("tag_lat_8B_fd", "TCP rdmx endpoint 8 B ping-pong, `fd()` taken (queue kept armed), one way, median", "us",
     rdmx_key("lat_us")),
    ("tag_lat_8B_event", "TCP rdmx endpoint 8 B ping-pong, event mode (both sleep on `fd()`), one way, median",
     "us", rdmx_key("lat_us")),
    ("fi_rxm_tagged_lat_8B", "TCP `fi_pingpong -p tcp;ofi_rxm -m tagged`, mean", "us", fi_pp),
    ("fi_rxm_msg_lat_8B", "TCP `fi_pingpong -p tcp;ofi_rxm -m msg`, mean", "us", fi_pp),
    ("fi_rdm_tagged_pingpong_8B", "TCP `fi_rdm_tagged_pingpong -p tcp;ofi_rxm`, mean", "us", fab(5)),
    ("ucx_tag_lat_8B", "TCP `ucx_perftest tag_lat`, typical", "us", ucx(2)),
    ("tag_rate_64B", "TCP rdmx endpoint 64 B, window 64", "msg/s", rdmx_key("msg_s")),
    ("tag_rate_64B_fd", "TCP rdmx endpoint 64 B, window 64, `fd()` taken", "msg/s", rdmx_key("msg_s")),
    ("ucx_tag_rate_64B", "TCP `ucx_perftest tag_bw -s 64`", "msg/s", ucx(8)),
    ("fi_rdm_tagged_bw_64B", "TCP `fi_rdm_tagged_bw -p tcp;ofi_rxm -S 64 -W 64` (1 / usec per xfer)", "msg/s",
     lambda rest: 1e6 / float(rest.split()[5])),
    ("tag_bw_1M", "TCP rdmx endpoint 1 MiB rendezvous, window 16", "MB/s", rdmx_key("mb_s")),
    ("tag_bw_1M_one_buffer", "TCP rdmx endpoint 1 MiB rendezvous, window 16, one buffer (`-1`)", "MB/s",
     rdmx_key("mb_s")),
    ("fi_rdm_tagged_bw_1M", "TCP `fi_rdm_tagged_bw -p tcp;ofi_rxm -S 1M -W 16`", "MB/s", fab(4)),
    ("fi_rma_bw_read_1M", "TCP `fi_rma_bw -p tcp;ofi_rxm -o read -S 1M -W 16`", "MB/s", fab(4)),
    ("ucx_tag_bw_1M", "TCP `ucx_perftest tag_bw -s 1M` (MiB/s as printed)", "MB/s", ucx(6)),
    ("ucx_tag_bw_1M_lo", "TCP `ucx_perftest tag_bw -s 1M`, `UCX_NET_DEVICES=lo` (MiB/s as printed)", "MB/s", ucx(6)),
    ("tag_bw_4M", "TCP rdmx endpoint 4 MiB rendezvous, window 8", "MB/s", rdmx_key("mb_s")),
    ("tag_bw_4M_one_buffer", "TCP rdmx endpoint 4 MiB rendezvous, window 8, one buffer (`-1`)", "MB/s",
     rdmx_key("mb_s")),
    ("fi_rdm_tagged_bw_4M", "TCP `fi_rdm_tagged_bw -p tcp;ofi_rxm -S 4M -W 8`", "MB/s", fab(4)),
    ("ucx_tag_bw_4M", "TCP `ucx_perftest tag_bw -s 4M` (MiB/s as printed)", "MB/s", ucx(6)),
    ("ucx_tag_bw_4M_lo", "TCP `ucx_perftest tag_bw -s 4M`, `UCX_NET_DEVICES=lo` (MiB/s as printed)", "MB/s", ucx(6)),
    ("first_msg", "TCP rdmx first message to a new peer, median", "us", rdmx_key("lat_us")),
    ("conn_rate_1024", "TCP rdmx 1024 peers, 64 at once: connections/s", "conn/s", rdmx_key("conn_s")),
    ("conn_rate_1024:lat", "TCP rdmx 1024 peers: insert to first pong, median", "us", rdmx_key("lat_us")),
    ("conn_rate_1024:p99", "TCP rdmx 1024 peers: insert to first pong, p99", "us", rdmx_key("p99_us")),
    ("rxe_tag_lat_8B", "rxe rdmx endpoint 8 B tagged ping-pong, one way, median", "us", rdmx_key("lat_us")),
    ("rxe_tag_lat_8B_busy", "rxe rdmx endpoint 8 B ping-pong, `busy_poll`, one way, median", "us",
     rdmx_key("lat_us")),
    ("rxe_fi_rdm_tagged_pingpong_8B", "rxe `fi_rdm_tagged_pingpong -p verbs;ofi_rxm`, mean", "us", fab(5)),
    ("rxe_tag_bw_1M", "rxe rdmx endpoint 1 MiB rendezvous, window 16", "MB/s", rdmx_key("mb_s")),
    ("rxe_fi_rdm_tagged_bw_1M", "rxe `fi_rdm_tagged_bw -p verbs;ofi_rxm -S 1M -W 16`", "MB/s", fab(4)),
    ("rxe_tag_bw_4M", "rxe rdmx endpoint 4 MiB rendezvous, window 8", "MB/s", rdmx_key("mb_s")),
    ("rxe_fi_rdm_tagged_bw_4M", "rxe `fi_rdm_tagged_bw -p verbs;ofi_rxm -S 4M -W 8`", "MB/s", fab(4)),
    ("rxe_first_msg", "rxe rdmx first message to a new peer, median", "us", rdmx_key("lat_us")),
    ("rxe_conn_rate_1024", "rxe rdmx 1024 peers, 64 at once: connections/s", "conn/s", rdmx_key("conn_s")),
    ("rxe_conn_rate_1024:lat", "rxe rdmx 1024 peers: insert to first pong, median", "us", rdmx_key("lat_us")),
    ("rxe_conn_rate_1024:p99", "rxe rdmx 1024 peers: insert to first pong, p99", "us", rdmx_key("p99_us")),
]

# (rdmx row, peer row, lower is better)
RATIOS = [
    ("tag_lat_8B", "fi_rxm_tagged_lat_8B", True),
    ("tag_lat_8B", "fi_rdm_tagged_pingpong_8B", True),
    ("tag_lat_8B", "ucx_tag_lat_8B", True),
    ("tag_lat_8B_busy", "fi_rdm_tagged_pingpong_8B", True),
    ("tag_lat_8B_busy", "tag_lat_8B", True),
    ("tag_lat_8B_fd", "tag_lat_8B", True),
    ("tag_lat_8B_event", "tag_lat_8B", True),
    ("tag_rate_64B", "ucx_tag_rate_64B", False),
    ("tag_rate_64B", "fi_rdm_tagged_bw_64B", False),
    ("tag_bw_1M", "fi_rdm_tagged_bw_1M", False),
    ("tag_bw_1M", "ucx_tag_bw_1M", False),
    ("tag_bw_4M", "fi_rdm_tagged_bw_4M", False),
    ("tag_bw_4M", "ucx_tag_bw_4M", False),
    ("tag_bw_1M_one_buffer", "fi_rdm_tagged_bw_1M", False),
    ("tag_bw_1M_one_buffer", "ucx_tag_bw_1M", False),
    ("tag_bw_1M_one_buffer", "ucx_tag_bw_1M_lo", False),
    ("tag_bw_4M_one_buffer", "fi_rdm_tagged_bw_4M", False),
    ("tag_bw_4M_one_buffer", "ucx_tag_bw_4M", False),
    ("tag_bw_4M_one_buffer", "ucx_tag_bw_4M_lo", False),
    ("rxe_tag_lat_8B", "rxe_fi_rdm_tagged_pingpong_8B", True),
    ("rxe_tag_lat_8B_busy", "rxe_fi_rdm_tagged_pingpong_8B", True),
    ("rxe_tag_lat_8B_busy", "rxe_tag_lat_8B", True),
    ("rxe_tag_bw_1M", "rxe_fi_rdm_tagged_bw_1M", False),
    ("rxe_tag_bw_4M", "rxe_fi_rdm_tagged_bw_4M", False),
]


def main():
    values = {}  # label -> {round: value}
    loads = {}
    rnd = 0
    prefix = ""
    for line in open(sys.argv[1]):
        m = re.match(r"# (guest )?round (\d+) load (\S+)", line)
        if m:
            prefix = "rxe " if m.group(1) else ""
            rnd = int(m.group(2))
            loads[prefix + str(rnd)] = m.group(3)
            continue
        parts = line.rstrip("\n").split(" ", 1)
        if len(parts) < 2:
            continue
        label, rest = parts
        for key, _, _, read in ROWS:
            base, _, _ = key.partition(":")
            if base != label:
                continue
            try:
                values.setdefault(key, {})[rnd] = read(rest)
            except (ValueError, IndexError, KeyError):
                values.setdefault(key, {})[rnd] = None
    rounds = sorted({r for v in values.values() for r in v})
    print("Load average per round: " + ", ".join(f"{k}: {v}" for k, v in loads.items()) + "\n")
    print("| row | unit | " + " | ".join(f"round {r}" for r in rounds) + " |")
    print("| --- | --- |" + " ---: |" * len(rounds))
    for key, desc, unit, _ in ROWS:
        if key not in values:
            continue
        cells = [values[key].get(r, "-") for r in rounds]
        print(f"| {desc} | {unit} | " +
              " | ".join("failed" if c is None else c if c == "-" else f"{c:.4g}" for c in cells) + " |")
    print("\n| ratio rdmx / peer | " + " | ".join(f"round {r}" for r in rounds) + " | range |")
    print("| --- |" + " ---: |" * (len(rounds) + 1))
    for a, b, lower in RATIOS:
        if a not in values or b not in values:
            continue
        rs = []
        for r in rounds:
            x, y = values[a].get(r), values[b].get(r)
            rs.append(x / y if x and y else None)
        ok = [x for x in rs if x is not None]
        rng = f"{min(ok):.2f}-{max(ok):.2f}" if ok else "-"
        print(f"| {a} / {b} ({'time' if lower else 'rate'}) | " +
              " | ".join("-" if x is None else f"{x:.2f}" for x in rs) + f" | {rng} |")


if __name__ == "__main__":
    main()
