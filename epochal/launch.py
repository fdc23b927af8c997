"""``epochal.run(app, config)``: an app's cluster started from Python, as ``epochal run``
starts it (the same plan, the same checks, the same supervisor)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from types import ModuleType

from epochal.actors.api import App
from epochal.config import ClusterConfig
from epochal.errors import ConfigError

__all__ = ["app_spec", "run"]


def run(app: App | str, config: ClusterConfig | None = None) -> int:
    """Run ``app`` (an App, or its ``module:attribute``) as a cluster until SIGTERM or Ctrl-C,
    which stop it at a savepoint; the exit code ``epochal run`` would end with (0: stopped at a
    savepoint). Call it from the main thread, under ``if __name__ == "__main__":`` when the app
    lives in the script itself: every process of the cluster imports the app's module again."""
    from epochal.actors.lifecycle import child_logging
    from epochal.cluster_plan import check_before_start, plan_cluster
    from epochal.supervisor import Supervisor

    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("epochal.run takes SIGTERM and SIGINT: call it from the main thread")
    spec = app if isinstance(app, str) else app_spec(app)
    plan = plan_cluster(spec, config or ClusterConfig())
    if not logging.getLogger().handlers:  # the app's own logging set up wins
        child_logging(logging.INFO)
    check_before_start(plan)
    return Supervisor(plan).run()


def app_spec(app: App) -> str:
    """The ``module:attribute`` every process loads ``app`` by. An app defined in the script
    being run (``__main__``) is loaded as the module its file would import as: the script's
    own directory is on ``sys.path``, and children must not import ``__main__``, which for them
    is another module (and another code hash)."""
    mains = ("__main__", "__mp_main__")
    modules = sorted(sys.modules.items(), key=lambda item: item[0] in mains)  # a module first
    for name, module in modules:
        attribute = _attribute_of(module, app)
        if attribute is None:
            continue
        if name not in mains:
            return f"{name}:{attribute}"
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name not in mains:
            return f"{spec.name}:{attribute}"  # python -m package.module
        file = getattr(module, "__file__", None)
        if file:
            return f"{Path(file).stem}:{attribute}"
    raise ConfigError(
        "epochal.run needs an app defined at the top level of a module file (every process of "
        "the cluster imports it again), or its module:attribute",
        app=app.name,
    )


def _attribute_of(module: ModuleType, app: App) -> str | None:
    """The name ``module`` binds ``app`` to at its top level, if any."""
    for attribute, value in list(vars(module).items()):
        if value is app:
            return attribute
    return None
