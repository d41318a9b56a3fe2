"""Turns harness results into the Markdown table and the list of targets met or missed."""

from __future__ import annotations

import dataclasses
import random
import statistics

from benchmarks.harness import Result, base_name

WORKLOAD_TITLES = {
    "mlp": "MLP, digits, batch 128 (overhead-bound)",
    "cnn": "CNN, 32x32x3, batch 64 (compute-bound)",
    "input": "MLP, digits + per-example augmentation, batch 128 (input-bound)",
}


def contender_title(name: str, steps_per_call: int) -> str:
    """A readable name for a contender id such as `keras3@N` (`#k`: the k-th process of it)."""
    name, _, copy = name.partition("#")
    if copy:
        return f"{contender_title(name, steps_per_call)}, process {copy}"
    fixed = {
        "reference": f"hand-written loop, {steps_per_call} steps/call (reference)",
        "reference-window": "hand-written loop, a window's steps/call (as orbitask's grown loops)",
        "reference-bounded": (
            f"hand-written loop, {steps_per_call} steps/call, orbitask's bounded prefetch"
        ),
        "orbitask": "orbitask default",
        "orbitask-fixed": f"orbitask, loops fixed at {steps_per_call} steps (loop_seconds=None)",
        "orbitask-quiet": "orbitask, default callbacks + progress off",
        "orbitask-autotune": (
            "orbitask, the workload's prefetch(AUTOTUNE) kept (train_prefetch=None)"
        ),
        "orbitask-lean": "orbitask, callbacks + progress + periodic checkpoints off",
        "orbitask-xla": "orbitask, jit_compile=True",
    }
    if name in fixed:
        return fixed[name]
    flavour, spe = name.split("@")
    spe = str(steps_per_call) if spe == "N" else spe
    return f"{'Keras 3' if flavour == 'keras3' else 'tf_keras'} fit, steps_per_execution={spe}"


def paired_ratio(result: Result, base: Result) -> float:
    """Median over rounds of `result`'s rate / `base`'s rate in the same round."""
    return statistics.median(a / b for a, b in zip(result.rates, base.rates, strict=True))


def ratio_interval(
    result: Result, base: Result, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A 95% bootstrap interval of `paired_ratio` (rounds resampled with replacement)."""
    ratios = [a / b for a, b in zip(result.rates, base.rates, strict=True)]
    return median_interval(ratios, resamples, seed)


def median_interval(
    ratios: list[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of per-round `ratios`."""
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def processes(results: list[Result], name: str) -> list[Result]:
    """The results of contender `name`'s processes (`name`, `name#2`, ...)."""
    return [r for r in results if base_name(r.contender) == name]


def pooled(results: list[Result], name: str) -> Result | None:
    """Contender `name` over all its processes (`name`, `name#2`, ...): each round's mean rate.

    Processes of one contender differ by a few percent for their whole life (benchmarks/
    RESULTS.md); averaging several is what narrows that. Returns None when `name` did not run.
    """
    runs = processes(results, name)
    if not runs:
        return None
    if len(runs) == 1:
        return runs[0]
    rates = [statistics.fmean(rs) for rs in zip(*(r.rates for r in runs), strict=True)]
    cpu = [statistics.fmean(rs) for rs in zip(*(r.cpu_rates for r in runs), strict=True)]
    rss = [r.peak_rss_mb for r in runs if r.peak_rss_mb]
    return dataclasses.replace(
        runs[0], rates=rates, cpu_rates=cpu, peak_rss_mb=statistics.fmean(rss) if rss else None
    )


def _interval_text(result: Result, base: Result) -> str:
    low, high = ratio_interval(result, base)
    return f"{low:.3f}-{high:.3f}"


def _ratio_text(result: Result, base: Result) -> str:
    return f"{paired_ratio(result, base):.3f} ({_interval_text(result, base)})"


def _cpu_ratio_text(result: Result, base: Result) -> str:
    """The paired ratio of steps per CPU-second (>1: fewer CPU seconds a step than `base`)."""
    if not result.cpu_rates or len(result.cpu_rates) != len(base.cpu_rates):
        return "-"
    as_rates = (dataclasses.replace(r, rates=r.cpu_rates) for r in (result, base))
    return _ratio_text(*as_rates)


def _by_name(results: list[Result]) -> dict[str, Result]:
    names = {base_name(r.contender) for r in results}
    return {name: pooled(results, name) for name in names}


def markdown(groups: list[list[Result]], steps_per_call: int) -> str:
    """One Markdown table: a block of rows per group."""
    lines = [
        "| workload | replicas | contender | steps/s median | min-max | ratio to reference "
        "(95% interval) | CPU time ratio (95% interval) | peak RSS MiB | RSS vs reference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for results in groups:
        ref = _by_name(results).get("reference")
        for r in results:
            ratio = _ratio_text(r, ref) if ref else "-"
            cpu_ratio = _cpu_ratio_text(r, ref) if ref else "-"
            rss = f"{r.peak_rss_mb:.0f}" if r.peak_rss_mb else "-"
            rss_vs = (
                f"{100 * (r.peak_rss_mb / ref.peak_rss_mb - 1):+.1f}%"
                if ref and ref.peak_rss_mb and r.peak_rss_mb
                else "-"
            )
            lines.append(
                f"| {r.group.workload} | {r.group.replicas} | "
                f"{contender_title(r.contender, steps_per_call)} | "
                f"{statistics.median(r.rates):.1f} | {min(r.rates):.1f}-{max(r.rates):.1f} | "
                f"{ratio} | {cpu_ratio} | {rss} | {rss_vs} |"
            )
    return "\n".join(lines)


def targets(groups: list[list[Result]]) -> list[str]:
    """One line per target that this run can check: the figure, the bound, met or missed."""
    out = []

    def check(label: str, value: float, ok: bool, text: str) -> None:
        out.append(f"- [{'met' if ok else 'MISSED'}] {label}: {text.format(value)}")

    for results in groups:
        by = _by_name(results)
        where = f"{results[0].group.workload} x{results[0].group.replicas}"
        ref, orb = by.get("reference"), by.get("orbitask")
        copies = processes(results, "reference")
        if len(copies) > 1:
            each = ", ".join(f"{paired_ratio(r, ref):.3f}" for r in copies)
            out.append(
                f"- [info] {where} noise floor: each reference process / their mean: {each} "
                "(same code, different processes)"
            )
        if ref and orb:
            v = paired_ratio(orb, ref)
            check(
                f"{where} orbitask / reference",
                v,
                v >= 0.97,
                f"{{:.3f}} (95% interval {_interval_text(orb, ref)}; target >= 0.97)",
            )
            if ref.peak_rss_mb and orb.peak_rss_mb:
                v = orb.peak_rss_mb / ref.peak_rss_mb - 1
                check(f"{where} orbitask peak RSS", v, v <= 0.05, "{:+.1%} vs reference (<= +5%)")
        keras = [by[k] for k in by if k.startswith("keras3@")]
        if orb and keras:
            best = max(keras, key=lambda k: statistics.median(k.rates))
            v = paired_ratio(orb, best)
            check(
                f"{where} orbitask / best Keras 3 fit ({best.contender})",
                v,
                v >= 1.0,
                f"{{:.3f}} (95% interval {_interval_text(orb, best)}; target >= 1)",
            )
        quiet = by.get("orbitask-quiet")
        if orb and quiet:
            v = 1 - paired_ratio(orb, quiet)
            check(f"{where} cost of default callbacks + progress", v, v <= 0.02, "{:.1%} (<= 2%)")
        lean = by.get("orbitask-lean")
        if lean and ref:
            v = paired_ratio(lean, ref)
            out.append(f"- [info] {where} orbitask with nothing on the host / reference: {v:.3f}")
        xla = by.get("orbitask-xla")
        if orb and xla:
            v = paired_ratio(xla, orb)
            out.append(f"- [info] {where} jit_compile=True / default: {v:.3f}")
        if orb and orb.extra.get("ckpt_save_ms"):
            out.append(
                f"- [info] {where} orbitask checkpoint saves inside timed windows: "
                f"{orb.extra['ckpt_save_ms']:.0f} ms each, {orb.extra['ckpt_share']:.0%} of the "
                "timed windows"
            )
        if orb and orb.extra.get("ckpt_first_kb"):
            first, last = orb.extra["ckpt_first_kb"], orb.extra["ckpt_last_kb"]
            check(
                f"{where} checkpoint size, first kept vs last",
                last / first - 1,
                last <= 1.2 * first,
                f"{first:.0f} KiB -> {last:.0f} KiB ({{:+.0%}}, {orb.extra['ckpts_kept']} kept)",
            )
    return out
