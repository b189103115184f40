"""Copy the engine's wheels of the pinned version into the new project's ``wheels/``, where its
``engine.txt`` sends pip, when the template is a local checkout that built them (its
``scripts/engine-wheels``, into its ``dist/``). The project then installs and deploys its engine
on any machine, from its own folder; nothing in it names the checkout.

Cookiecutter renders this file with Jinja and runs it in the new project's folder. Missing wheels
are not an error: the project's README ("Take engine updates") says where else pip may look.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

_SOURCE = json.loads(r"""{{ {"dist": cookiecutter | engine_dist, "version": engine_version} | tojson }}""")


def copy_wheels(dist: str, version: str, project: Path) -> list[str]:
    """The pinned version's two wheels from ``dist`` into ``project/wheels``; their names, or
    none where ``dist`` lacks either."""
    names = [f"{name}-{version}-py3-none-any.whl" for name in ("kafka_delta", "kafka_delta_dev")]
    if not dist or not all((Path(dist) / name).is_file() for name in names):
        return []
    (project / "wheels").mkdir(exist_ok=True)
    for name in names:
        shutil.copyfile(Path(dist) / name, project / "wheels" / name)
    return names


if __name__ == "__main__":
    if _SOURCE["dist"] and not copy_wheels(_SOURCE["dist"], _SOURCE["version"], Path.cwd()):
        print(
            f"note: the template's checkout has no wheels of kafka-delta {_SOURCE['version']} "
            f"in {_SOURCE['dist']} (its scripts/engine-wheels builds them): put them in this "
            "project's wheels/, or point engine.txt elsewhere (README, 'Take engine updates').",
            file=sys.stderr,
        )
