"""controller.report: report.html with every plot from a synthetic history; missing metrics skip plots.

Run: `.venv/bin/python -m pytest tests/controller/test_report.py`.
"""

import math

import pytest

from controller.report import format_summary, summarize, write_report

ALL_PLOTS = ("success", "reward_vs_true", "length", "tools", "invalid_loop", "safety", "logprob_gap",
             "throughput", "learner", "infra_errors", "staleness")


def synthetic_history(steps=30, hacking=False):
    history = []
    for s in range(1, steps + 1):
        success = 0.1 + 0.5 * s / steps
        true = (0.6 - 0.4 * s / steps) if hacking else success
        row = {
            "step": s, "time": 1000.0 + s,
            "rollout/success_rate": success, "rollout/verify_pass_rate": success, "reward/mean": success + 0.05,
            "reward/true_metric": true, "reward/true_metric_corr": 0.9 - 0.01 * s,
            "rollout/turns": 2 + s % 3, "rollout/tokens": 60 + s, "rollout/tool_calls": 1.5, "rollout/tool_cost": 0.1,
            "rollout/invalid_loop_rate": 0.02, "rollout/safety_violations": float(s % 7 == 0),
            "staleness/mean": 0.5, "staleness/max": 1.0, "staleness/hist/0": 60.0, "staleness/hist/1": 4.0,
            "learner/loss": 1 / s, "learner/kl": 0.01, "learner/entropy": 1.2, "learner/clip_frac": 0.05,
            "learner/grad_norm": 0.7, "learner/logprob_gap": 1e-6, "perf/rollout_tokens_per_s": 900.0 + s,
            "perf/learner_tokens_per_s": 3000.0, "perf/weight_sync_s": 0.2, "perf/step_s": 4.0,
            "infra/errors/tool_timeout": float(s % 10 == 0),
        }
        if s % 10 == 0 or s == 1:
            row["eval/success_rate"] = {1: 0.1, 10: 0.2, 20: 0.35, 30: 0.5}[s]
        history.append(row)
    history[5]["learner/loss"] = None  # NaN written as null by JsonlTracker
    return history


def test_report_with_every_plot(tmp_path):
    path = write_report(tmp_path, synthetic_history(), {"wall time s": 312.5}, staleness_hist={0: 1800, 1: 120, 2: 3})
    assert path == tmp_path / "report.html"
    page = path.read_text()
    for name in ALL_PLOTS:
        png = tmp_path / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"src='plots/{name}.png'" in page
    assert "Not drawn" not in page and "Reward hacking?" not in page
    assert "<th>success before</th><td>0.1</td>" in page and "<th>success after</th><td>0.5</td>" in page
    assert "<th>wall time s</th><td>312.5</td>" in page


def test_report_warns_of_reward_hacking(tmp_path):
    page = write_report(tmp_path, synthetic_history(hacking=True), {}).read_text()
    assert "<b>Reward hacking?</b> reward rose while the true metric fell" in page


def test_report_skips_missing_metrics(tmp_path):
    history = [{"step": s, "reward/mean": 0.1 * s} for s in range(1, 6)]
    page = write_report(tmp_path, history, {}).read_text()
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == []
    assert "Not drawn" in page and "Reward vs true metric" in page
    write_report(tmp_path / "empty", [], {})  # an empty run still gets a page


def test_summary_numbers():
    summary = summarize(synthetic_history())
    assert summary["steps"] == 30
    assert (summary["success before"], summary["success after"]) == (0.1, 0.5)  # first and last eval
    assert summary["rollout tokens/s (median)"] == pytest.approx(915.5)  # median of 901..930
    assert summary["weight sync s (mean)"] == pytest.approx(0.2)
    # without eval: mean training success of the first and last 5 steps: .1 + .5 * (1..5)/30 -> .1 + .5 * 3/30 = .15
    no_eval = [{k: v for k, v in r.items() if k != "eval/success_rate"} for r in synthetic_history()]
    s = summarize(no_eval)
    assert s["success before"] == pytest.approx(0.15) and s["success after"] == pytest.approx(0.1 + 0.5 * 28 / 30)
    # per-env evaluation keys, as the loop logs them
    per_env = [{"step": r["step"], **({"eval/calc/success_rate": r["eval/success_rate"]} if "eval/success_rate" in r
                                      else {})} for r in synthetic_history()]
    s = summarize(per_env)
    assert (s["success metric"], s["success before"], s["success after"]) == ("eval/calc/success_rate", 0.1, 0.5)
    two = per_env + [{"step": 31, "eval/hard/success_rate": 0.2}]
    assert summarize(two)["success after (eval/hard/success_rate)"] == 0.2
    text = format_summary({"steps": 3, "success after": 0.5, "loss": math.nan})
    assert text.splitlines() == ["steps          3", "success after  0.5", "loss           nan"]
