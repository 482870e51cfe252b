#!/usr/bin/env python3
"""bench/summarize.py: the target table that docs/performance.md quotes.

Feeds it raw lines as bench/compare.sh writes them and checks the ratios, the goal
checks in both directions, the bootstrap range and the report's rows."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SUMMARIZE = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "bench", "summarize.py")


def line(rep, backend, tool, test, size, metric, value):
    return json.dumps({"rep": rep, "backend": backend, "tool": tool, "test": test, "size": size,
                       "metric": metric, "value": value})


class Summarize(unittest.TestCase):
    def run_summarize(self, lines, *extra):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = tmp.name
        with open(os.path.join(d, "results.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        out = os.path.join(d, "report")
        subprocess.run([sys.executable, SUMMARIZE, d, out, "--reps", "5", "--no-plot", *extra], check=True)
        with open(out + ".json") as f:
            doc = json.load(f)
        with open(out + ".md") as f:
            md = f.read()
        self.assertFalse(os.path.exists(out + ".png"))
        if extra:  # --many-conn: some rows exist for both backends
            return {(t["backend"], t["target"]): t for t in doc["targets"]}, md
        return {t["target"]: t for t in doc["targets"]}, md

    def test_ratios_goals_and_ranges(self):
        lines = []
        # TCP 8 B latency (lower is better, goal <= 1.0x): rdmx median 4, UCX median 5.
        for rep, (x, y) in enumerate(zip([3, 4, 4, 5, 6], [4, 5, 5, 6, 9]), 1):
            lines.append(line(rep, "tcp", "rdmx", "send_lat", 8, "lat_us", x))
            lines.append(line(rep, "tcp", "ucx", "tag_lat", 8, "lat_us", y))
        # TCP write 1 MiB (higher is better): rdmx median 3000, UCX 2500 (1.2x < 1.5x: missed),
        # iperf3 3200 (0.94x >= 0.9x: met).
        for rep, (x, u, i) in enumerate(zip([2900, 3000, 3100, 2800, 3300], [2500] * 5, [3200] * 5), 1):
            lines.append(line(rep, "tcp", "rdmx", "write_bw", 1 << 20, "mb_s", x))
            lines.append(line(rep, "tcp", "ucx", "ucp_put_bw", 1 << 20, "mb_s", u))
            lines.append(line(rep, "tcp", "iperf3", "stream", 1 << 20, "mb_s", i))
        lines.append(line(0, "tcp", "load", "-", 0, "load", 0.5))
        targets, md = self.run_summarize(lines)

        lat = targets["send/recv 8 B latency vs UCX tag_lat"]
        self.assertAlmostEqual(lat["ratio"], 4 / 5)
        self.assertTrue(lat["met"])
        self.assertEqual(lat["rdmx_runs"], [3, 4, 4, 5, 6])
        lo, hi = lat["ratio_90"]
        self.assertLessEqual(lo, lat["ratio"])
        self.assertGreaterEqual(hi, lat["ratio"])
        self.assertLess(lo, hi)

        put = targets["write 1 MiB bw vs UCX ucp_put_bw"]
        self.assertAlmostEqual(put["ratio"], 3000 / 2500)
        self.assertFalse(put["met"])
        iperf = targets["write 1 MiB bw vs iperf3 (1 MiB writes)"]
        self.assertAlmostEqual(iperf["ratio"], 3000 / 3200)
        self.assertTrue(iperf["met"])
        # A peer whose runs are all equal: the range comes from rdmx's spread alone. A draw of
        # 5 runs has the lowest (highest) of them as its median with probability 5.8 % (3 or
        # more of the 5 picks), just over the 5 % each tail leaves out.
        self.assertAlmostEqual(iperf["ratio_90"][0], 2800 / 3200)
        self.assertAlmostEqual(iperf["ratio_90"][1], 3300 / 3200)

        # No runs of either tool: no ratio, no verdict, no range.
        none = targets["send 64 KiB bw vs UCX tag_bw"]
        self.assertIsNone(none["ratio"])
        self.assertIsNone(none["met"])
        self.assertIsNone(none["ratio_90"])

        self.assertIn("| tcp: send/recv 8 B latency vs UCX tag_lat | 4.00 us | 5.00 us | 0.80x | "
                      f"{lo:.2f}-{hi:.2f}x | <= 1.0x | yes |", md)
        self.assertIn("| tcp: write 1 MiB bw vs UCX ucp_put_bw | 3000.00 MB/s | 2500.00 MB/s | 1.20x |", md)
        self.assertIn("| >= 1.5x | **no** |", md)

    def test_same_data_same_report(self):
        lines = [line(r, "verbs", t, "send_lat", 2, "lat_us", v)
                 for r, (t, v) in enumerate([("rdmx", 20), ("perftest", 21), ("rdmx", 25), ("perftest", 22),
                                             ("rdmx", 30), ("perftest", 30), ("rdmx", 16), ("perftest", 15)])]
        a, _ = self.run_summarize(lines)
        b, _ = self.run_summarize(lines)
        row = "send_lat 2 B vs perftest ib_send_lat"
        self.assertEqual(a[row]["ratio_90"], b[row]["ratio_90"])
        self.assertAlmostEqual(a[row]["ratio"], 22.5 / 21.5)

    def test_many_conn_rows(self):
        # compare.sh --many-conn: issue 17's rows only, no targets, every run by rep with its load.
        lines = []
        for rep, (own, shared, ucx) in enumerate(zip([800e3, 700e3, 750e3], [150e3, 160e3, 170e3],
                                                     [600e3, 640e3, 680e3]), 1):
            lines.append(line(rep, "tcp", "load", "-", 0, "load", rep + 0.5))
            lines.append(line(rep, "tcp", "rdmx", "send_bw_q8", 64, "msg_s", own))
            lines.append(line(rep, "tcp", "rdmx", "send_bw_q8_shared", 64, "msg_s", shared))
            lines.append(line(rep, "tcp", "ucx", "tag_bw_T8", 64, "msg_s", ucx))
            lines.append(line(rep, "tcp", "rdmx", "send_lat_event", 8, "server_cpu_us_per_rt", 30 + rep))
            lines.append(line(rep, "tcp", "ucx", "tag_lat_sleep", 8, "server_cpu_us_per_rt", 15))
        rows, md = self.run_summarize(lines, "--many-conn")
        self.assertNotIn(("tcp", "send/recv 8 B latency vs UCX tag_lat"), rows)  # the targets of issue 3 go
        shared = rows["tcp", "send 64 B x 8 connections, one shared CQ vs 8 CQs (message rate)"]
        self.assertAlmostEqual(shared["ratio"], 160e3 / 750e3)
        self.assertEqual(shared["unit"], "msg/s")
        lo, hi = shared["ratio_90"]
        self.assertLessEqual(lo, shared["ratio"])
        self.assertGreaterEqual(hi, shared["ratio"])
        ucx = rows["tcp", "send 64 B x 8 connections, 8 CQs vs UCX tag_bw -T 8 (message rate)"]
        self.assertAlmostEqual(ucx["ratio"], 750e3 / 640e3)
        cpu = rows["tcp", "8 B ping-pong, server CPU per round trip, event mode vs UCX -I -E sleep"]
        self.assertAlmostEqual(cpu["ratio"], 32 / 15)
        self.assertIsNone(rows["verbs", "send 64 B x 8 connections, one shared CQ vs ib_send_bw -q 8 (message rate)"]["ratio"])
        self.assertIn("| tcp: send 64 B x 8 connections, one shared CQ vs 8 CQs (message rate) | "
                      f"160000.00 msg/s | 750000.00 msg/s | 0.21x | {lo:.2f}-{hi:.2f}x |", md)
        self.assertIn("| tcp | load | - | 0 B | load | 1.5 | 2.5 | 3.5 |", md)
        self.assertIn("| tcp | rdmx | send_bw_q8 | 64 B | msg_s | 8e+05 | 7e+05 | 7.5e+05 |", md)

    def test_atomics_rows(self):
        # compare.sh --atomics: issue 19's rows only; rates higher-is-better, latencies lower.
        lines = []
        for rep, (lat, ucx_lat, rate, pt_rate) in enumerate(
                zip([20, 22, 21], [9, 8, 10], [50e3, 55e3, 60e3], [100e3, 110e3, 90e3]), 1):
            lines.append(line(rep, "tcp", "load", "-", 0, "load", rep + 1.5))
            lines.append(line(rep, "tcp", "rdmx", "fetch_add_lat", 8, "lat_us", lat))
            lines.append(line(rep, "tcp", "ucx", "ucp_fadd", 8, "lat_us", ucx_lat))
            lines.append(line(rep, "verbs", "rdmx", "compare_swap_bw", 8, "msg_s", rate))
            lines.append(line(rep, "verbs", "perftest", "compare_swap_bw", 8, "msg_s", pt_rate))
        rows, md = self.run_summarize(lines, "--atomics")
        self.assertNotIn(("tcp", "send/recv 8 B latency vs UCX tag_lat"), rows)
        self.assertNotIn(("tcp", "send 64 B x 8 connections, one shared CQ vs 8 CQs (message rate)"), rows)
        lat = rows["tcp", "fetch_add 8 B latency (round trip, median) vs UCX ucp_fadd"]
        self.assertAlmostEqual(lat["ratio"], 21 / 9)
        self.assertEqual(lat["unit"], "us")
        rate = rows["verbs", "compare_swap 8 B rate, window 128 vs ib_atomic_bw -A CMP_AND_SWAP -t 128 -o 128"]
        self.assertAlmostEqual(rate["ratio"], 55e3 / 100e3)
        self.assertEqual(rate["unit"], "msg/s")
        self.assertIsNone(rows["tcp", "fetch_add 8 B rate, window 128 vs UCX ucp_add -O 128 (no fetch)"]["ratio"])
        self.assertIn("8 B remote atomics (issue 19)", md)
        self.assertIn("| tcp | load | - | 0 B | load | 2.5 | 3.5 | 4.5 |", md)


if __name__ == "__main__":
    unittest.main()
