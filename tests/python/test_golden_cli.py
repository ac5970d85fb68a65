"""The ropekv binary from outside: fuzz --json against docs/report-schema.json (hand-written check,
jsonschema is not installed), the closing line, exit codes, golden write/check round trip and a
golden file read back with safetensors + ml_dtypes, and one-line errors for corrupted files."""
import json
import subprocess

import numpy as np
import pytest


def run(binary, *args, check_rc=None):
    p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=300)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.stdout, p.stderr)
    return p


TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "null": type(None),
         "object": dict, "array": list}


def validate(value, schema, defs, path="$"):
    """A small JSON-schema subset: type, const, enum, required, properties, items, $ref,
    additionalProperties (schema), minItems, minimum, pattern."""
    import re
    if "$ref" in schema:
        schema = defs[schema["$ref"].split("/")[-1]]
    if "const" in schema:
        assert value == schema["const"], f"{path}: expected {schema['const']!r}, got {value!r}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(isinstance(value, TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool))
                 for k in kinds)
        assert ok, f"{path}: expected {kinds}, got {type(value).__name__}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: missing required key {key!r}"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                validate(value[key], sub, defs, f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, v in value.items():
                if key not in schema.get("properties", {}):
                    validate(v, extra, defs, f"{path}.{key}")
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0), f"{path}: too few items"
        if "items" in schema:
            for i, v in enumerate(value):
                validate(v, schema["items"], defs, f"{path}[{i}]")
    if "minimum" in schema and isinstance(value, (int, float)):
        assert value >= schema["minimum"], f"{path}: {value} < {schema['minimum']}"
    if "pattern" in schema and isinstance(value, str):
        assert re.match(schema["pattern"], value), f"{path}: {value!r} !~ {schema['pattern']}"


@pytest.fixture(scope="module")
def schema(repo_root):
    return json.loads((repo_root / "docs" / "report-schema.json").read_text())


def test_fuzz_json_validates_and_closing_line(ropekv_bin, schema, tmp_path):
    out = tmp_path / "r.json"
    p = run(ropekv_bin, "fuzz", "--backends", "ref,sim", "--cases", "15", "--max-tokens", "8",
            "--seed", "2", "--json", str(out), check_rc=0)
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("15 passed, 0 failed") or " passed, 0 failed" in last, last
    report = json.loads(out.read_text())
    validate(report, schema, schema["$defs"])
    assert report["counts"]["total"] == 15
    assert report["summary"] == last


def test_shard_reports_validate_and_merge(ropekv_bin, schema, tmp_path):
    """Two shard reports merged validate, and the merged counts equal one unsharded run."""
    reports = []
    for k in range(2):
        path = tmp_path / f"s{k}.json"
        run(ropekv_bin, "fuzz", "--backends", "ref,ref", "--cases", "10", "--max-tokens", "4",
            "--seed", "9", "--shard", f"{k}/2", "--max-ulp", "0", "--strict", "--json", str(path), check_rc=0)
        reports.append(path)
    merged = tmp_path / "m.json"
    run(ropekv_bin, "report", "merge", *map(str, reports), "--json", str(merged), check_rc=0)
    m = json.loads(merged.read_text())
    validate(m, schema, schema["$defs"])
    whole = tmp_path / "w.json"
    run(ropekv_bin, "fuzz", "--backends", "ref,ref", "--cases", "10", "--max-tokens", "4",
        "--seed", "9", "--max-ulp", "0", "--strict", "--json", str(whole), check_rc=0)
    w = json.loads(whole.read_text())
    assert w["counts"] == m["counts"]


def test_fuzz_profile_aligned16_takes_the_fast_path(ropekv_bin, schema, tmp_path):
    """--profile aligned16 (the GPU fast paths' domain): 200 cases ref vs sim pass, the report
    validates, records the profile, and most cases ran fast_v4 (only a few percent do under the
    default profile, shown on the same seed)."""
    counts = {}
    for profile in ("aligned16", "any"):
        out = tmp_path / f"{profile}.json"
        p = run(ropekv_bin, "fuzz", "--backends", "ref,sim", "--profile", profile, "--cases", "200",
                "--max-tokens", "16", "--json", str(out), check_rc=0)
        assert p.stdout.strip().splitlines()[-1].startswith("200 passed, 0 failed"), p.stdout
        report = json.loads(out.read_text())
        validate(report, schema, schema["$defs"])
        assert report["config"]["profile"] == profile
        assert sum(report["variants"].values()) == 200, report["variants"]
        assert "sim kernels: " in p.stdout
        counts[profile] = report["variants"].get("fast_v4", 0)
    assert counts["aligned16"] >= 160, counts
    assert counts["any"] < counts["aligned16"] / 4, counts


def test_golden_write_check_and_read_from_python(ropekv_bin, tmp_path):
    from safetensors.numpy import load_file
    from safetensors import safe_open
    import ml_dtypes

    path = tmp_path / "g.safetensors"
    run(ropekv_bin, "golden", "write", "--preset", "deepseek-v3-tp8", "--tokens", "2", "--out", str(path), check_rc=0)
    p = run(ropekv_bin, "golden", "check", str(path), "--backend", "sim", check_rc=0)
    assert p.stdout.strip().splitlines()[-1] == "1 passed, 0 failed"
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    assert meta["format"] == "ropekv-golden"
    # Data movement is exact: the nope part of q_out is q_nope, bit for bit, so the file stores
    # only q_out's rope columns and says how q_out.expected is rebuilt.
    derived = json.loads(meta["derived"])
    assert derived["q_out.expected"] == {"concat_last": ["q_nope", "q_out.expected.rope"], "shape": [2, 16, 576]}
    assert load_file(str(path))["q_out.expected.rope"].shape == (2, 16, 64)
    full = tmp_path / "all.safetensors"
    run(ropekv_bin, "golden", "write", "--preset", "deepseek-v3-tp8", "--tokens", "2", "--store-all",
        "--out", str(full), check_rc=0)
    tensors = load_file(str(full))
    q_out = tensors["q_out.expected"].view(ml_dtypes.bfloat16) if tensors["q_out.expected"].dtype != ml_dtypes.bfloat16 else tensors["q_out.expected"]
    q_nope = tensors["q_nope"]
    assert q_out.shape == (2, 16, 576)
    assert np.array_equal(q_out[:, :, :512].view(np.uint16), q_nope.view(np.uint16))
    assert np.array_equal(q_out[:, :, 512:].view(np.uint16),
                          load_file(str(path))["q_out.expected.rope"].view(np.uint16))


def test_corrupted_golden_one_line_exit_2(ropekv_bin, tmp_path):
    path = tmp_path / "g.safetensors"
    run(ropekv_bin, "golden", "write", "--repro", "tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=4 nb=1",
        "--out", str(path), check_rc=0)
    data = path.read_bytes()
    for name, content in [("trunc", data[: len(data) // 2]), ("tiny", data[:3]),
                          ("garbage", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")]:
        bad = tmp_path / f"{name}.safetensors"
        bad.write_bytes(content)
        p = run(ropekv_bin, "golden", "check", str(bad), "--backend", "ref")
        assert p.returncode == 2, (name, p.stdout, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, (name, p.stderr)
        assert p.stderr.startswith("ropekv: error: ")


def test_unknown_things_exit_2(ropekv_bin):
    for args in (["fuzz", "--nope"], ["run", "--preset", "gpt-5"], ["fuzz", "--backends", "ref,quantum"]):
        p = run(ropekv_bin, *args)
        assert p.returncode == 2
        assert len(p.stderr.strip().splitlines()) == 1


def test_golden_check_finds_a_wrong_expected_value(ropekv_bin, schema, tmp_path):
    """Flip one byte of q_out.expected (nope part) in a valid file: golden check FAILS (exit 1),
    names the element, and its --json case record validates against the schema's case item."""
    import struct
    path = tmp_path / "g.safetensors"
    run(ropekv_bin, "golden", "write", "--repro", "tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=4 nb=1",
        "--store-all", "--out", str(path), check_rc=0)  # q_out.expected stored whole
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    begin = header["q_out.expected"]["data_offsets"][0]
    # element [1, 0, 3] of a bf16 [2, 2, 12] tensor: index (1*2+0)*12+3 = 27, low byte
    data[8 + n + begin + 2 * 27] ^= 0x01
    bad = tmp_path / "wrong.safetensors"
    bad.write_bytes(bytes(data))
    rec_path = tmp_path / "rec.json"
    p = run(ropekv_bin, "golden", "check", str(bad), "--backend", "ref", "--json", str(rec_path))
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "token=1 head=0 dim=3" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == "0 passed, 1 failed"
    rec = json.loads(rec_path.read_text())
    validate(rec, schema["properties"]["cases"]["items"], schema["$defs"])
    assert rec["outcome"] == "FAILED"
    nope = [r for r in rec["regions"] if r["name"] == "q_out.nope"][0]
    assert nope["mismatches"] == 1 and nope["first_mismatches"][0]["ulp"] == 1
