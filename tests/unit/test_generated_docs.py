"""Generated artefacts are committed up to date: the CRD in crds/ and the field reference in README.md."""

from pathlib import Path

from duplex.crd_cli import CRD_FILE
from duplex.reference import BEGIN, END, markdown

ROOT = Path(__file__).resolve().parents[2]


def test_readme_field_reference_matches_the_models():
    text = (ROOT / "README.md").read_text()
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == markdown(), "README field reference is stale: run `make docs`"


def test_reference_lists_every_rule_message():
    import json

    from duplex.crd import crd

    schema_text = json.dumps(crd())
    for line in markdown().splitlines():
        if line.startswith("- `"):
            message = line.split(": ", 1)[1]
            assert message.split(" (")[0][:40] in schema_text.replace("\\n", " ")


def test_committed_crd_is_current(capsys):
    from duplex.crd_cli import main

    main([])
    assert (ROOT / "crds" / CRD_FILE).read_text() == capsys.readouterr().out, "crds/ is stale: run `make crds`"
