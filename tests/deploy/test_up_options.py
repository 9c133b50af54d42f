"""What ``Up`` passes on to the processes it starts (no process is started here)."""

from __future__ import annotations

from pathlib import Path

from sdcp_fast.deploy.up import Up


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_m_batch_limit_and_device_reach_the_drafters_and_verifiers(tmp_path: Path) -> None:
    up = Up(tmp_path, model="toy", fixed_m=2, max_batch=8, device="cuda:1")
    up.plan()
    for name in ("drafter-a", "drafter-b"):
        argv = up.services[name].argv
        assert _value(argv, "--m") == "2" and _value(argv, "--device") == "cuda:1" and "--max-batch" not in argv
    for name in ("verifier", "verifier-standby"):
        argv = up.services[name].argv
        assert _value(argv, "--max-batch") == "8" and _value(argv, "--device") == "cuda:1" and "--m" not in argv
    assert not {"--m", "--max-batch", "--device"} & set(up.services["router"].argv + up.services["mlc"].argv)


def test_by_default_each_service_keeps_its_own(tmp_path: Path) -> None:
    up = Up(tmp_path, model="toy")
    up.plan()
    for svc in up.services.values():
        assert not {"--m", "--max-batch", "--device"} & set(svc.argv)


def test_the_prefill_chunk_reaches_the_verifiers_only(tmp_path: Path) -> None:
    up = Up(tmp_path, model="toy", prefill_chunk=64)
    up.plan()
    for svc in up.services.values():
        assert _value(svc.argv, "--prefill-chunk") == ("64" if svc.role == "verifier" else None), svc.name
    default = Up(tmp_path / "default", model="toy")
    default.plan()
    assert not any("--prefill-chunk" in svc.argv for svc in default.services.values())


def test_the_prefill_solo_budget_reaches_the_verifiers_only(tmp_path: Path) -> None:
    up = Up(tmp_path, model="toy", prefill_solo=1024)
    up.plan()
    for svc in up.services.values():
        assert _value(svc.argv, "--prefill-solo") == ("1024" if svc.role == "verifier" else None), svc.name
    default = Up(tmp_path / "default", model="toy")
    default.plan()
    assert not any("--prefill-solo" in svc.argv for svc in default.services.values())
