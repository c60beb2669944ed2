"""Table 5's paper-scale plan rehearsed end to end on this CPU (ACTION=rehearse; a file of its own so that
the suite's two rehearsals run on two pytest-xdist workers at once)."""

import json

import pytest

from .helpers import assert_plan_holds, rehearse

# MNLI and SQuAD: one GLUE task and SQuAD at 384 tokens over phase 2's 512; QNLI, MRPC and SST-2 take the GLUE
# path MNLI takes, each run end to end by Table 5 at smoke scale (test_tables_e2e.py)
GLUE_ALIKE = [f"--set=columns.{column}=null" for column in ("qnli_acc", "mrpc_acc", "sst2_acc")]
# No NSP pre-trains as MLM + NSP does less a head, in the same two phases: left-to-right keeps the other path
NO_NSP = ["--set=rows.no_nsp=null", "--set=pretrain.no_nsp=null"]


@pytest.mark.slow
def test_table5_rehearses_at_paper_scale(tmp_path, monkeypatch, shared_data):
    """Each kind of row (its pre-training, in two phases: MLM + NSP, left-to-right; + BiLSTM) on MNLI and
    SQuAD, each grid's first point (GRID=first): the full plan's 298 runs would take the suite 10 minutes."""
    folder, cells, record = rehearse("table5", "paper", tmp_path, monkeypatch, "--rehearse-grid", "first",
                                     *GLUE_ALIKE, *NO_NSP)
    assert record["runs"] == 4 + 3 * (18 + 1) and record["rehearsed_jobs"] == 4 + 3 * 2
    ours = [c for c in cells if c["status"] != "paper"]
    assert {(c["row"], c["column"]) for c in ours} == {
        (row, column) for row in ("bert_base", "ltr_no_nsp", "ltr_no_nsp_bilstm")
        for column in ("mnli_m_acc", "squad_v1_f1")}
    assert all(c["status"] == "ok" for c in ours), [c for c in ours if c["status"] != "ok"]
    for row in ("bert_base", "ltr_no_nsp", "ltr_no_nsp_bilstm"):  # SQuAD's own layer of the rehearsal
        squad, mnli = (json.loads(next((folder / "finetune" / row / task).glob("*/results.json")).read_text())
                       for task in ("squad_v1", "mnli"))
        # a few questions' windows, about as many sequences as the other tasks' examples; Dev scored whole
        # (every batch: the fraction 1.0, not one batch) over 8 questions, as the official scorer needs
        assert squad["data_sizes"]["train"] <= 2 * mnli["data_sizes"]["train"], (squad["data_sizes"], row)
        limit = squad["config"]["optim"]["limit_val_batches"]
        assert isinstance(limit, float) and limit == 1.0 and squad["config"]["data"]["max_dev_examples"] == 8
    assert_plan_holds(record, folder)
