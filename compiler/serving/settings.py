"""What `compiler.serving.compile_tuned` does to a serving process's process-wide settings: it sets only
what the preset measured away from torch's defaults (its precision policy's float32 switches where
they differ, its runtime settings, Inductor's `freezing`), records each change with its old value
(`Applied.changed`) and says it once (`RuntimeSettingWarning`); a setting the preset leaves alone
that this process holds otherwise than the preset was measured under is left as it is, and said
(`SettingMismatchWarning`), or refused under `strict` (`ExportError`) before anything is set.

This module imports neither Ray nor `orchestrator`, and torch only inside the methods.
"""

from __future__ import annotations

from typing import Any

from compiler.serving.files import ExportError, warn_caller


class RuntimeSettingWarning(UserWarning):
    """`compile_tuned` changed a process-wide setting (a runtime setting of `compiler.runtime`, a
    float32 switch of the preset's precision policy, Inductor's freezing) to the value the preset
    was measured under."""


class SettingMismatchWarning(UserWarning):
    """A process-wide setting the preset leaves alone differs in this process from what the preset
    was measured under (torch's default): its latency and accuracy figures do not hold here.
    `strict=True` raises `ExportError` instead."""


class ProcessSettings:
    """The settings one `compile_tuned` call sets and checks, recorded into its `Applied`."""

    def __init__(self, applied: Any, strict: bool):
        self.applied = applied
        self.strict = strict

    def preflight(self, name: str, config: Any) -> None:
        """Check, before anything is set, the settings policy `name` and `config` leave alone against
        what they were measured under (torch's defaults)."""
        from compiler import precision, runtime

        policy = precision.policy(name)
        measured = {k: v for k, v in policy.settings().items() if k not in policy.explicit()}
        measured.update(
            {k: v for k, v in runtime.effective(config.runtime).items() if k not in config.runtime}
        )
        self.check(measured, {**precision.current(), **runtime.current()})

    def precision(self, name: str) -> None:
        """Set what policy `name` changes from torch's defaults (the stock `fp32` changes nothing:
        the process keeps its own switches)."""
        from compiler import precision

        policy = precision.policy(name)
        before = precision.current()
        precision.write(policy.explicit())
        self.changed(before, precision.current())
        self.applied.precision = name

    def runtime(self, config: Any) -> None:
        """Set the preset's runtime settings (only those it names), as the job that measured it did
        before its first call. A process keeps its first cuDNN plan per convolution, so this must happen before the
        model's first convolution runs in the process."""
        from compiler import runtime

        before = runtime.current()
        self.check(
            {k: v for k, v in runtime.effective(config.runtime).items() if k not in config.runtime}, before
        )
        runtime.apply_only(config.runtime)
        self.applied.runtime = runtime.current()
        self.changed(before, self.applied.runtime)

    def inductor(self, config: Any) -> None:
        """Inductor's process-wide settings of the preset (`freezing`), said where they change."""
        import torch._inductor.config as inductor_config

        before = {"freezing": bool(inductor_config.freezing)}
        config.apply_globals()
        self.changed(before, {"freezing": bool(inductor_config.freezing)})

    def changed(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """Record, and say, the settings that went from `before` to `after`."""
        changed = {k: [before[k], v] for k, v in after.items() if k in before and before[k] != v}
        if not changed:
            return
        self.applied.changed.update(changed)
        what = ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in changed.items())
        message = (
            f"compile_tuned: set the process-wide settings the preset was measured under ({what}); "
            "they apply to every model in this process"
        )
        self.applied.warnings.append(message)
        warn_caller(message, RuntimeSettingWarning)

    def check(self, measured: dict[str, Any], current: dict[str, Any]) -> None:
        """Warn, or raise under `strict`, where a setting the preset leaves alone is not what it was
        measured under in this process."""
        off = {k: (current[k], v) for k, v in measured.items() if k in current and current[k] != v}
        if not off:
            return
        what = ", ".join(
            f"{k} is {cur} here, the preset was measured with {want}" for k, (cur, want) in off.items()
        )
        message = (
            f"compile_tuned: {what}: the preset's latency and accuracy figures do not hold in this process "
            "(compile_tuned changes only what the preset sets; reset these to torch's defaults to serve it as "
            "measured)"
        )
        if self.strict:
            raise ExportError(message)
        self.applied.warnings.append(message)
        warn_caller(message, SettingMismatchWarning)
