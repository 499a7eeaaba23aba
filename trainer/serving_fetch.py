"""`python -m trainer.serving_fetch SOURCE DEST`: copy a run's published serving versions (`<run>/serving/<n>/`)
into a local folder, for tensorflow/serving to load (`--model_base_path=DEST`).

The serving Deployment of a run on S3 runs it as an init container of the trainer's own image: the
tensorflow/serving images have had no `s3://` file system since 2.7, while the trainer's image reads the store
as the trainer does (`runfolder.storage`, with the pod's identity). Exit 0 when at least one version was copied,
2 when the source holds none (nothing to serve: a bad configuration, not a transient failure), 1 on a failed
transfer (the store's own retries spent), for the kubelet to run the init container again.
"""

from __future__ import annotations

import os
import sys

from runfolder.storage import download_many, open_store


def fetch(source: str, dest: str) -> int:
    """Copy every object under `source` (a store URI ending in the serving folder) to `dest`, keeping the
    `<version>/...` layout; returns how many versions were copied."""
    store = open_store(source)
    keys = [k for k in store.list("") if k.split("/", 1)[0].isdigit() and "/" in k]
    download_many(store, {k: os.path.join(dest, *k.split("/")) for k in keys}, skip_existing=False)
    return len({k.split("/", 1)[0] for k in keys})


def main(argv: list[str] | None = None) -> int:
    """Copy SOURCE's versions to DEST; one line on stderr says what was done or why not."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("trainer.serving_fetch: usage: python -m trainer.serving_fetch SOURCE DEST", file=sys.stderr)
        return 2
    try:
        versions = fetch(*args)
    except Exception as e:  # noqa: BLE001 - the stores raise many types; each is one line and a retry
        print(f"trainer.serving_fetch: {args[0]}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not versions:
        print(f"trainer.serving_fetch: {args[0]} holds no version (<n>/saved_model.pb): run ops serve",
              file=sys.stderr)
        return 2
    print(f"trainer.serving_fetch: {versions} version(s) from {args[0]} in {args[1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
