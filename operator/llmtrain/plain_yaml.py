"""YAML as a reviewer reads it: shared dicts (one toleration object in two pod templates, say) are
written out in full each time, never as `&id001` anchors and `*id001` aliases."""

from __future__ import annotations

from typing import Any

import yaml


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(data: Any, **options: Any) -> str:
    """`yaml.safe_dump` with key order kept and no anchors."""
    text: str = yaml.dump(data, Dumper=_PlainDumper, sort_keys=False, **options)
    return text
