"""A reshard job's fingerprint (reshard/plan.py): the same job through freshly signed urls of
the same objects is the same job; anything that changes the inputs is another."""

from __future__ import annotations

from streamrec.reshard.plan import fingerprint_of
from streamrec.storage.base import ObjectInfo

SIGNED = (
    "https://b.s3.amazonaws.com/d/part-0.tfrecord?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKID%2F20261127%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={date}"
    "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={sig}"
)


def _job(url: str, size: int = 100, version: str | None = '"e"') -> str:
    return fingerprint_of([ObjectInfo(url, size, version)], {"max_bytes": 1 << 20})


def test_freshly_signed_urls_of_the_same_objects_are_the_same_job() -> None:
    first = _job(SIGNED.format(date="20261127T100000Z", sig="aa11"))
    again = _job(SIGNED.format(date="20261127T110000Z", sig="bb22"))
    assert first == again
    sas = "https://acct.blob.core.windows.net/c/part-0.tfrecord?sv=2024&se={se}&sig={sig}"
    assert _job(sas.format(se="2026-11-27T10", sig="x")) == _job(
        sas.format(se="2026-11-28", sig="y")
    )


def test_what_pins_the_objects_still_tells_jobs_apart() -> None:
    url = SIGNED.format(date="20261127T100000Z", sig="aa11")
    assert _job(url) != _job(url, size=101)
    assert _job(url) != _job(url, version='"f"')
    assert _job(url) != _job(url.replace("part-0", "part-1"))


def test_plain_urls_keep_the_fingerprints_of_earlier_versions() -> None:
    """Urls without credentials are hashed as they are, as before this change: an unsigned
    query is part of the object's name."""
    import hashlib
    import json

    from streamrec.reshard.plan import PLAN_VERSION

    url = "https://host/data/part-0.tfrecord?generation=7"
    document = {"plan": PLAN_VERSION, "inputs": [[url, 100, '"e"']], "max_bytes": 1 << 20}
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    assert _job(url) == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert _job(url) != _job("https://host/data/part-0.tfrecord?generation=8")


def test_a_plan_by_rows_is_another_job_only_where_its_shards_differ() -> None:
    """Parquet's ``num_shards`` planned by rows: a job state written when it was planned by
    whole files (the same ``source``) is not resumed into other shards; rotation by
    ``max_records`` plans alike both ways and keeps its fingerprint."""
    from streamrec.reshard.plan import make_plan

    files = [
        ObjectInfo(f"pq/f-{k}.parquet", 1000, None, records=rows)
        for k, rows in enumerate([10, 0, 15])
    ]

    def plan(by_rows: bool, **limits: int | None) -> tuple[str, list[int]]:
        settings = {"max_records": None, "max_bytes": None, "num_shards": None, **limits}
        made = make_plan(
            files,
            "out/part-{index:03d}.tfrecord",
            compression=None,
            shuffle=False,
            seed=0,
            source="parquet/1",
            by_rows=by_rows,
            **settings,
        )
        return made.fingerprint, [n for task in made.tasks for n in task.output_records]

    by_files, by_rows = plan(False, num_shards=3), plan(True, num_shards=3)
    assert by_files[0] != by_rows[0]
    assert len(by_rows[1]) == 3 and max(by_rows[1]) - min(by_rows[1]) <= 1
    assert sum(by_rows[1]) == sum(f.records or 0 for f in files)
    assert plan(False, max_records=4)[0] == plan(True, max_records=4)[0]
