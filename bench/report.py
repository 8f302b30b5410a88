"""What ``python -m bench.pipeline`` prints: each phase's rates, verdicts and CPU per sample, and the Telegraf
peer's ratios (bench.peer)."""

from __future__ import annotations

from typing import Any

from bench import peer
from bench.cpu import cpu_table


def _verdict_line(verdicts: dict[str, int]) -> None:
    judged_n = sum(verdicts.values())
    share = ", ".join(f"{v} {n / max(1, judged_n):.1%}" for v, n in sorted(verdicts.items()))
    print(f"{'samples judged, by verdict':52} {judged_n:>12,}   {share}")


def report(results: dict[str, Any]) -> None:
    """The run's results as a table (bench.pipeline's phases, then the peer's)."""
    first = results["saturation"][0]
    print()
    print(f"{'measure':52} {'samples/s':>12}")
    if "kafka" in results:
        kc, ic = results["kafka"], results["influxdb"]
        ceiling_rate = min(kc["producer_samples_per_s"], kc["consumer_samples_per_s"], ic["points_per_s"])
        results["ratio_to_slower_ceiling"] = first["samples_per_s"] / ceiling_rate
        print(f"{'Kafka ProducerPerformance (x8 samples/record)':52} {kc['producer_samples_per_s']:>12,.0f}")
        print(f"{'Kafka ConsumerPerformance (x8 samples/record)':52} {kc['consumer_samples_per_s']:>12,.0f}")
        print(
            f"{'InfluxDB raw client write (points/s)':52} {ic['points_per_s']:>12,.0f}   "
            f"influxd {ic['influxd_us_per_point']:.1f} us/point ({ic['influxd_settle_us_per_point']:.1f} writing out "
            f"its cache after), {ic['influxd_us_per_field']:.2f} us/field, "
            f"{ic['fields_per_point']:.1f} fields/point, load {ic['load'][0]:.1f}"
        )
        oc = ic["on_change"]
        print(
            f"{'  the same, moving readings on change (points/s)':52} {oc['points_per_s']:>12,.0f}   "
            f"influxd {oc['influxd_us_per_point']:.1f} us/point, {oc['influxd_us_per_field']:.2f} us/field, "
            f"{oc['fields_per_point']:.1f} fields/point, load {oc['load'][0]:.1f}"
        )
        print("  fields per sample of the gpu measurement, by kind:")
        for kind, n in ic["field_budget"].items():
            print(f"    {kind:48} {n:6.2f}")
        print(f"    {'total':48} {sum(ic['field_budget'].values()):6.2f}")
    for sat in results["saturation"]:
        print(
            f"{'pipeline, saturated (backlog drain)':52} {sat['samples_per_s']:>12,.0f}   "
            f"{sat['workers']} worker(s), baselines v{sat['baselines_version']}, load {sat['load'][0]:.1f}"
        )
        if sat["processor_drain_samples_per_s"]:
            print(f"{'  processor stage alone (its lag drained)':52} {sat['processor_drain_samples_per_s']:>12,.0f}")
        if sat is first and "ratio_to_slower_ceiling" in results:
            print(f"{'ratio to the slower ceiling':52} {results['ratio_to_slower_ceiling']:>12.2f}")
        _verdict_line(sat["verdicts"])
        if sat.get("unmeasured"):
            print(f"  saturated: CPU per sample not measured: {sat['unmeasured']}")
            continue
        cpu_table(
            "saturated",
            sat["us_per_sample"],
            f"broker ingest {sat['broker_ingest_us_per_sample']:.1f} more; influxd writing out its cache after the "
            f"drain {sat['influxd_settle_us_per_sample']:.1f} of it",
        )
        if sat is not first:
            cpu = sat["us_per_sample"]["processor"] / first["us_per_sample"]["processor"]
            drain = (sat["processor_drain_samples_per_s"] or 0.0) / (first["processor_drain_samples_per_s"] or 1.0)
            print(
                f"  {sat['workers']} vs {first['workers']} processor(s): CPU per sample x{cpu:.2f} (so x"
                f"{sat['workers'] / first['workers'] / cpu:.2f} the stage's throughput on as many cores each), "
                f"lag drain x{drain:.2f} on this box"
            )
        for name, top in sat.get("profiles", {}).items():
            print(f"  {name}: top functions by self time (py-spy)")
            for function, share in top:
                print(f"    {share:6.1%}  {function}")
    if "live" in results:
        lv = results["live"]
        print(
            f"{'pipeline, live ' + str(lv['gpus']) + ' GPUs @1 Hz (sustained)':52} {lv['samples_per_s']:>12,.0f}"
            f"   late rounds {lv['late_rounds']}, drained {lv['drained']}, baselines v{lv['baselines_version']}, "
            f"load {lv['load'][0]:.1f}"
        )
        print(
            f"{'latency sample -> stored p50 / p99 / max (s)':52} "
            f"{lv['latency_p50_s']:.3f} / {lv['latency_p99_s']:.3f} / {lv['latency_max_s']:.3f}"
            f"   write retries {lv['write_retries']}"
        )
        _verdict_line(lv["verdicts"])
        app_s = lv["gpu_seconds_by_application"]
        named = 1 - app_s.get("unknown", 0.0) / max(1.0, sum(app_s.values()))
        print(f"{'GPU time judged as a named application (or idle)':52} {named:>12.1%}")
        print(
            f"{'memory per GPU: processor(s) / sink(s) (RSS over idle)':52} "
            f"{lv['processor_bytes_per_gpu'] / 1024:.1f} / {lv['sink_bytes_per_gpu'] / 1024:.1f} KiB"
        )
        cpu_table(
            "live",
            lv["us_per_sample"],
            f"influxd writing out its cache after the run {lv['influxd_settle_us_per_sample']:.1f} of it",
        )
    if "peer" in results:
        peer.report(results)
