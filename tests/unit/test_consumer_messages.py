from common.protocol import RUN_JOB_TASK, job_id_of


def test_job_id_from_celery_protocol_v2_body() -> None:
    body = [[], {"job_id": "job_1"}, {"callbacks": None}]
    assert job_id_of(body, {"task": RUN_JOB_TASK}) == "job_1"


def test_other_tasks_and_malformed_bodies_are_ignored() -> None:
    assert job_id_of([[], {"job_id": "j"}, {}], {"task": "other"}) is None
    assert job_id_of({"job_id": "j"}, {"task": RUN_JOB_TASK}) is None
    assert job_id_of([[], {}, {}], {"task": RUN_JOB_TASK}) is None
