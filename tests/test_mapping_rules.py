"""Rule files: loading, presets, and errors that name the file, the rule and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otel_proofscope.mapping.rules import (
    PRESETS_DIR,
    RuleError,
    Target,
    load_rules,
    preset_names,
)


def _write(tmp_path: Path, text: str, name: str = "rules.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(RuleError) as info:
        load_rules(str(path))
    message = str(info.value)
    assert str(path) in message  # every error names the file
    return message


def test_presets_load_by_name_and_cite_every_name_they_match() -> None:
    assert {"sp1", "jolt"} <= set(preset_names())
    for name in preset_names():
        rules = load_rules(name)
        assert rules.path == PRESETS_DIR / f"{name}.toml"
        assert rules.label == name
        assert rules.meta.system and rules.meta.sources
        cited = "\n".join(rules.meta.sources)
        # every source is "owner/repo: path (…)"
        for source in rules.meta.sources:
            assert re.match(r"^[\w.-]+/[\w.-]+: \S+\.\w+ \(", source), source
        for rule in rules.spans:
            names = [rule.match.name] if rule.match.name else []
            if rule.match.regex is not None:
                # alternatives of an anchored (a|b|c) group, unescaped
                body = rule.match.regex.pattern.strip("^$").strip("()")
                names = [n.replace("\\.", ".") for n in body.split("|")]
            assert names, rule
            for n in names:
                assert n in cited, f"{name}: {n!r} is matched but not cited in [meta].sources"


def test_sp1_preset_maps_the_phases() -> None:
    rules = load_rules("sp1")
    by_target = {r.to: r for r in rules.spans}
    assert by_target[Target.PROOF].match.name == "prove_core"
    assert by_target[Target.LAYER].match.name == "prove_shard"
    assert by_target[Target.STARK].match.matches("compress", {})
    assert by_target[Target.VERIFY].match.name == "verify"


def test_a_rule_file_by_path_with_line_rules_of_the_other_reader(tmp_path: Path) -> None:
    path = _write(tmp_path, """
[meta]
name = "mine"
system = "myzk"
sources = ["me/prover: src/lib.rs (prove)"]
detect = ["my-prover"]

[[span]]
match = "prove"
to = "proof"

[[span]]
match_regex = "^layer_"
where = { "stage" = "gkr" }
to = "layer"
index_from = "layer"
kind_from = "op"

[[event]]
match = "round done"
on = "layer_mul"
to = "round"
round_from = "i"
copy = { "proof.claim" = "claim" }

[[line]]
anything = "read by mapping/lines.py, not here"
""")
    rules = load_rules(str(path))
    assert rules.label == str(path)
    assert rules.meta.name == "mine" and rules.meta.detect == ("my-prover",)
    assert [r.to for r in rules.spans] == [Target.PROOF, Target.LAYER]
    layer = rules.spans[1]
    assert layer.match.matches("layer_mul", {"stage": "gkr"})
    assert not layer.match.matches("layer_mul", {"stage": "other"})
    assert not layer.match.matches("prove", {"stage": "gkr"})
    assert rules.events[0].on is not None and rules.events[0].copy == {"proof.claim": "claim"}


@pytest.mark.parametrize(("text", "expected"), [
    ("[metadata]\nname = 'x'\n", "unknown top-level key 'metadata'"),
    ("[meta]\nnme = 'x'\n", "[meta]: unknown key 'nme'"),
    ("[[span]]\nmatch = 'a'\nto = 'proof'\n[[span]]\nmatch = 'b'\nto = 'layer'\nindx = 'i'\n",
     "[[span]] #2: unknown key 'indx'"),
    ("[[span]]\nmatch = 'a'\n", "[[span]] #1: missing key 'to'"),
    ("[[span]]\nmatch = 'a'\nto = 'lyer'\n", "[[span]] #1: key 'to' is 'lyer', not one of"),
    ("[[span]]\nto = 'proof'\n", "[[span]] #1: needs 'match'"),
    ("[[span]]\nmatch = 'a'\nmatch_regex = 'b'\nto = 'proof'\n", "not both"),
    ("[[span]]\nmatch_regex = '(unclosed'\nto = 'proof'\n",
     "[[span]] #1 key 'match_regex': not a valid regular expression"),
    ("[[span]]\nmatch = 'a'\nto = 'layer'\nround_from = 'r'\n",
     "[[span]] #1: key 'round_from' only applies to to = \"round\""),
    ("[[span]]\nmatch = 'a'\nto = 'proof'\nindex_from = 'i'\n",
     "[[span]] #1: key 'index_from' only applies to to = \"layer\""),
    ("[[span]]\nmatch = 'a'\nto = 'layer'\nkind = 'MatMul'\nkind_from = 'k'\n",
     "excludes 'kind_from'"),
    ("[[span]]\nmatch = 'a'\nto = 'proof'\nattributes = { x = { y = 1 } }\n",
     "[[span]] #1: key 'attributes.x' must be"),
    ("[[span]]\nmatch = 'a'\nto = 'proof'\nwhere = { x = [1] }\n", "key 'where.x' must be"),
    ("[[event]]\nmatch = 'r'\nto = 'sumcheck'\n", "[[event]] #1: key 'to' is 'sumcheck'"),
    ("[[event]]\nmatch = 'r'\nto = 'round'\nround = 'i'\n", "[[event]] #1: unknown key 'round'"),
    ("span = 3\n", "'span' must be an array of tables"),
    ("[meta]\ndetect = ['(bad']\n", "[meta] key 'detect': not a valid regular expression"),
    ("[[span]\n", "not valid TOML"),
])
def test_rule_file_errors_name_file_rule_and_key(tmp_path: Path, text: str,
                                                 expected: str) -> None:
    assert expected in _error(tmp_path, text)


def test_unknown_name_lists_the_presets(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match=r"no preset or rule file named 'sp2'.*sp1"):
        load_rules("sp2")
    with pytest.raises(RuleError, match="no preset or rule file"):
        load_rules(str(tmp_path / "missing.toml"))
