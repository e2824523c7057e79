"""Where bubblewrap cannot run (the set-up could not install it, or namespaces are refused), the suite's shell
tests that are not about the sandbox run unsandboxed, as `ctproxy up --sandbox danger-full-access` would; the
sandbox's own tests skip with the reason (tests/tools_server/shell/test_shell_sandbox.py). Without this, every shell
test would
meet `unavailable` on such a machine, which is the product's right answer but not what those tests check."""

from __future__ import annotations

from proxy.sandbox.bwrap import sandbox_problem

MISSING = sandbox_problem("workspace-write")  # why the default mode cannot run here, or None
FALLBACK = "danger-full-access"


def use_fallback_default() -> None:
    """In this process, a Config() built by a test defaults to the unsandboxed mode."""
    from proxy.config import Config, ShellConfig

    ShellConfig.model_fields["sandbox"].default = FALLBACK
    ShellConfig.model_rebuild(force=True)
    Config.model_rebuild(force=True)


def extra_up_args(args: list[str]) -> list[str]:
    """`ctproxy up` / `python -m tools_server` arguments for a test process: --sandbox danger-full-access added
    where the sandbox cannot run and the test chose no mode itself."""
    return [*args, "--sandbox", FALLBACK] if MISSING and "--sandbox" not in args else args
