"""The CLI half of the bad-input catalog.

Every row is one bad command line or one unreadable input file. Each must end the process with
exit code 2, print nothing on stdout, and print exactly one line on stderr, of the form
"ropekv: error: ...", that names the offending argument (each row lists the fragments that line
must contain). A known CLI defect is recorded as a row marked defect(...) (strict xfail): it starts
failing (XPASS) the day the CLI is fixed, so the mark must then be removed. None is open now.

Run: ROPEKV_BIN=build/ropekv python -m pytest -v tests/python/test_cli_catalog.py
(-v lists every case with its id). scripts/test.sh also runs it against build-asan/ropekv (ASan +
UBSan, float-cast-overflow included), where a sanitizer finding exits 86: no row passes with one.
"""
import copy
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

SMALL_REPRO = "tq=2 ts=3 tk=3 h=2 dn=16 dr=8 p=16 bs=4 nb=2 seed=3"

# Environment without the variables `--shard auto/N` reads.
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "JOB_COMPLETION_INDEX")}


def run_cli(ropekv_bin, args, timeout=60):
    return subprocess.run([ropekv_bin, *args], capture_output=True, text=True, timeout=timeout,
                          env=CLEAN_ENV)


@pytest.fixture(scope="module")
def golden_files(ropekv_bin, tmp_path_factory):
    """A valid golden file and damaged copies of it, by name."""
    d = tmp_path_factory.mktemp("cli_catalog")
    good = d / "good.safetensors"
    r = run_cli(ropekv_bin, ["golden", "write", "--repro", SMALL_REPRO, "--out", str(good)])
    assert r.returncode == 0, r.stderr
    data = good.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    assert 8 + header_len < len(data)
    files = {"good": good, "dir": d / "a_directory", "missing": d / "missing.safetensors"}
    files["dir"].mkdir()

    def write(name, content):
        p = d / f"{name}.safetensors"
        p.write_bytes(content)
        files[name] = p

    write("truncated_data", data[: 8 + header_len + 4])  # header intact, tensor data cut
    write("truncated_header", data[: 8 + header_len // 2])
    write("five_bytes", data[:5])
    write("empty", b"")
    bad_json = bytearray(data)
    bad_json[8] = ord("x")  # '{' -> 'x'
    write("header_not_json", bytes(bad_json))
    write("header_length_huge", struct.pack("<Q", 1 << 60) + data[8:])
    header = data[8: 8 + header_len]
    assert header.count(b'"BF16"') >= 1
    write("unknown_dtype", data[:8] + header.replace(b'"BF16"', b'"QQ16"', 1) + data[8 + header_len:])
    return files


def check_one_error_line(r, fragments):
    assert r.returncode == 2, f"exit code {r.returncode}; stderr: {r.stderr!r}"
    assert r.stdout == "", f"stdout should be empty, got {r.stdout!r}"
    lines = r.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}: {r.stderr!r}"
    line = lines[0]
    assert line.startswith("ropekv: error: "), line
    for f in fragments:
        assert f in line, f"stderr line does not name {f!r}: {line!r}"


def defect(reason):
    return pytest.mark.xfail(strict=True, reason="known CLI defect (reported): " + reason)


# (id, args, fragments the one stderr line must contain)
USAGE_CASES = [
    pytest.param(["frobnicate"], ["unknown subcommand 'frobnicate'", "expected one of: info, run"],
                 id="unknown subcommand"),
    pytest.param(["--frob", "info"], ["--frob"], id="unknown top-level option"),
    pytest.param(["--frob"], ["unknown option '--frob'"], id="unknown top-level option alone"),
    pytest.param(["golden", "--frob"], ["unknown golden option '--frob'"], id="unknown golden option"),
    pytest.param(["golden", "frob"], ["unknown golden subcommand 'frob'", "expected one of: write, check"],
                 id="unknown golden subcommand"),
    pytest.param(["report", "frob"], ["unknown report subcommand 'frob'", "expected one of: merge"],
                 id="unknown report subcommand"),
    pytest.param([], ["subcommand"], id="no subcommand"),
    pytest.param(["run", "--frob"], ["--frob"], id="unknown option of run"),
    pytest.param(["fuzz", "--cases", "1", "--no-such-flag"], ["--no-such-flag"], id="unknown option of fuzz"),
    pytest.param(["run", "--preset", "nope"], ["preset", "nope"], id="unknown preset"),
    pytest.param(["golden", "write", "--preset", "nope", "--out", "{tmp}/p.safetensors"], ["preset", "nope"],
                 id="unknown preset (golden write)"),
    pytest.param(["run", "--preset", "deepseek-v3", "--backend", "nope"], ["backend", "nope"],
                 id="unknown backend (run)"),
    pytest.param(["fuzz", "--backends", "ref,nope", "--cases", "1"], ["backend", "nope"],
                 id="unknown backend (fuzz)"),
    pytest.param(["fuzz", "--backends", "ref", "--cases", "1"], ["--backends"], id="--backends without a pair"),
    pytest.param(["run", "--repro", "foo=1"], ["repro", "foo"], id="repro: unknown key"),
    pytest.param(["run", "--repro", "tq=abc"], ["tq", "abc"], id="repro: bad integer"),
    pytest.param(["run", "--repro", "style=foo"], ["style", "foo"], id="repro: bad enum value"),
    pytest.param(["run", "--repro", "k_scale=nan"], ["k_scale", "nan"], id="repro: NaN scale"),
    pytest.param(["run", "--repro", "tq=5 ts=2 tk=5"], ["tq", "ts"], id="repro: Tq > Ts"),
    pytest.param(["run", "--repro", "ts=5 tk=2"], ["ts", "tk"], id="repro: Ts > Tk"),
    pytest.param(["run", "--repro", "dr=7"], ["dr", "7"], id="repro: odd Dr"),
    pytest.param(["run", "--repro", "tq=1 tq=2"], ["tq"], id="repro: repeated key"),
    pytest.param(["run", "--repro", "tq"], ["repro", "tq"], id="repro: token without ="),
    pytest.param(["fuzz", "--repro", "tq=2 ts=1"], ["tq", "ts"], id="repro: Tq > Ts (fuzz)"),
    pytest.param(["run", "--repro", "layout=shuffled bs=8"], ["bs", "multiple of 16", "8"],
                 id="repro: shuffled block size"),
    pytest.param(["run", "--repro", "layout=shuffled bs=16 dn=100"], ["dn", "multiple of 8", "100"],
                 id="repro: shuffled Dn and the 16-byte run"),
    pytest.param(["run", "--repro", "layout=shuffled bs=16 cache=fp8_e4m3fn dr=24"],
                 ["dr", "multiple of 16", "24"], id="repro: shuffled fp8 Dr"),
    pytest.param(["run", "--repro", "layout=shuffled bs=16 entry_pad=8"], ["entry_pad", "8"],
                 id="repro: shuffled entry padding"),
    pytest.param(["run", "--repro", "layout=shuffled bs=16 order=rope_first"],
                 ["order", "nope_first", "rope_first"], id="repro: shuffled rope_first"),
    pytest.param(["run", "--repro", "layout=fp8_ds_mla"], ["cache", "u8", "656-byte entries", "bf16"],
                 id="repro: fp8_ds_mla without a u8 cache"),
    pytest.param(["run", "--repro", "layout=fp8_ds_mla cache=u8 dn=256"], ["dn", "512", "256"],
                 id="repro: fp8_ds_mla Dn"),
    pytest.param(["run", "--repro", "layout=fp8_ds_mla cache=u8 in=f32"], ["in", "bf16 or f16", "f32"],
                 id="repro: fp8_ds_mla f32 input"),
    pytest.param(["run", "--repro", "layout=fp8_ds_mla cache=u8 entry_pad=2"], ["entry_pad", "multiple of 4", "2"],
                 id="repro: fp8_ds_mla entry padding"),
    pytest.param(["run", "--repro", "ds_scale=pow2"], ["ds_scale", "amax", "fp8_ds_mla", "pow2"],
                 id="repro: ds_scale without fp8_ds_mla"),
    pytest.param(["run", "--repro", "cache=u8"], ["cache", "u8"], id="repro: u8 cache without fp8_ds_mla"),
    pytest.param(["run", "--repro", "layout=fp8_ds_mla cache=u8 ds_scale=ue8m0"], ["ds_scale", "amax|pow2", "ue8m0"],
                 id="repro: unknown ds_scale"),
    pytest.param(["golden", "write", "--repro", "layout=fp8_ds_mla cache=u8 order=rope_first", "--out", "{tmp}/d.safetensors"],
                 ["order", "nope_first", "rope_first"], id="golden write: fp8_ds_mla rope_first"),
    pytest.param(["run", "--repro", "tq=2 ts=2 tk=2 dec_out=qzk dec=3"], ["dec", "0 .. 2", "3"],
                 id="repro: decode outputs with N > Tq"),
    pytest.param(["run", "--repro", "dec_out=kz"], ["dec_out", "q, z, k", "'kz'"],
                 id="repro: decode output letters out of order"),
    pytest.param(["run", "--repro", "tq=2 ts=2 tk=2 dec_out=k dec=1"], ["dec", "1"],
                 id="repro: N without a decode output of N rows"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "dec_out=all"], ["dec_out", "'all'"],
                 id="pin: unknown decode outputs"),
    pytest.param(["bench", "--backend", "ref", "--decode", "-1"], ["--decode", "'-1'"], id="bench: decode -1"),
    pytest.param(["bench", "--backend", "ref", "--decode", "0x2"], ["--decode", "'0x2'"], id="bench: decode in hex"),
    pytest.param(["golden", "write", "--pin", "layout=shuffled", "--repro", "tq=1", "--out", "x"],
                 ["--pin", "--random"], id="golden write: --pin without --random"),
    pytest.param(["bench", "--backend", "ref", "--layout", "tiled"], ["--layout", "tiled"],
                 id="bench: unknown layout"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "3/2"], ["--shard", "3/2"], id="shard K >= N"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "1/0"], ["--shard", "1/0"], id="shard N = 0"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "x"], ["--shard", "x"], id="shard not K/N"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "auto/4"], ["--shard"], id="shard auto without env"),
    pytest.param(["fuzz", "--time", "abc"], ["--time", "abc"], id="time not a duration"),
    pytest.param(["fuzz", "--time", "-5s"], ["--time", "-5s"], id="time negative"),
    pytest.param(["fuzz", "--time", "0"], ["--time"], id="time zero"),
    pytest.param(["fuzz", "--time", "5x"], ["--time", "5x"], id="time unknown unit"),
    pytest.param(["fuzz", "--time", "inf"], ["--time", "'inf'"], id="time inf"),
    pytest.param(["fuzz", "--time", "1e308h"], ["--time", "'1e308h'"], id="time 1e308h (inf seconds)"),
    pytest.param(["fuzz", "--seed", "abc"], ["--seed", "abc"], id="seed not an integer"),
    pytest.param(["fuzz", "--cases", "-3"], ["--cases", "-3"], id="negative case count"),
    pytest.param(["fuzz", "--cases", "1", "--max-ulp", "-1"], ["--max-ulp"], id="negative max-ulp"),
    pytest.param(["fuzz", "--cases", "1", "--max-tokens", "100000"], ["--max-tokens"], id="max-tokens too big"),
    pytest.param(["fuzz", "--cases", "1", "--profile", "nope"], ["--profile", "expected one of any, aligned16", "got 'nope'"],
                 id="unknown fuzz profile"),
    pytest.param(["golden", "write", "--preset", "deepseek-v3", "--format", "xyz", "--out", "{tmp}/f"],
                 ["--format", "xyz"], id="unknown golden format"),
    pytest.param(["golden", "check"], ["file"], id="golden check without a file"),
    # integers are plain decimal digits in range (no octal, hex, exponent, sign, wrap or clamp)
    pytest.param(["fuzz", "--cases", "0x10"], ["--cases", "decimal integer", "'0x10'"], id="cases in hex"),
    pytest.param(["fuzz", "--cases", "1e3"], ["--cases", "'1e3'"], id="cases with an exponent"),
    pytest.param(["fuzz", "--cases", "0"], ["--cases", "1..", "'0'"], id="zero cases"),
    pytest.param(["fuzz", "--cases", "-1"], ["--cases", "'-1'"], id="cases -1"),
    pytest.param(["fuzz", "--cases", "9223372036854775807", "--time", "1s"], ["--cases", "9223372036854775807"],
                 id="cases beyond the bound"),
    pytest.param(["fuzz", "--cases", "1", "--seed", "-1"], ["--seed", "'-1'"], id="seed -1"),
    pytest.param(["fuzz", "--cases", "1", "--seed", "18446744073709551616"], ["--seed", "18446744073709551616"],
                 id="seed 2^64"),
    pytest.param(["fuzz", "--cases", "1", "--seed", "12345678901234567890123456"], ["--seed"], id="seed of 26 digits"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "0/9223372036854775807"], ["--shard", "1048576"],
                 id="shard count beyond the bound"),
    pytest.param(["run", "--preset", "deepseek-v3", "--tokens", "+4"], ["--tokens", "'+4'"], id="tokens with a sign"),
    pytest.param(["bench", "--backend", "ref", "--case", "deepseek-v3:1e9"], ["--case", "TOKENS", "'1e9'"],
                 id="bench: TOKENS with an exponent"),
    pytest.param(["bench", "--backend", "ref", "--threads", "100000"], ["--threads", "1..1024"], id="bench: threads 100000"),
    pytest.param(["bench", "--backend", "ref", "--copy-mb", "17592186044416"], ["--copy-mb", "1..65536"],
                 id="bench: copy of 2^44 MiB"),
    pytest.param(["bench", "--backend", "ref", "--variant", "hpb=0x4"], ["--variant", "'0x4'"], id="bench: variant value in hex"),
    pytest.param(["bench", "--backend", "ref", "--budget", "nan"], ["--budget", "finite", "nan"], id="bench: budget NaN"),
    pytest.param(["bench", "--backend", "ref", "--budget", "1e999"], ["--budget", "finite", "inf"], id="bench: budget 1e999 (inf)"),
    # lists without empty items; text options given empty
    pytest.param(["bench", "--backend", "ref", "--mode", ","], ["--mode", "non-empty items"], id="bench: mode list ','"),
    pytest.param(["bench", "--backend", "ref", "--cache", "bf16,,f16"], ["--cache", "'bf16,,f16'"],
                 id="bench: cache list with an empty item"),
    pytest.param(["fuzz", "--backends", "ref,"], ["--backends", "'ref,'"], id="backends with an empty name"),
    pytest.param(["fuzz", "--repro", ""], ["--repro", "non-empty", "''"], id="empty repro"),
    pytest.param(["fuzz", "--time", ""], ["--time", "non-empty"], id="empty time"),
    pytest.param(["fuzz", "--cases", "1", "--json", ""], ["--json", "non-empty"], id="empty json path"),
    pytest.param(["fuzz", "--cases", "1", "--dump", ""], ["--dump", "non-empty"], id="empty dump folder"),
    pytest.param(["golden", "write", "--repro", "", "--out", "{tmp}/x.safetensors"], ["--repro", "non-empty"],
                 id="golden write: empty repro"),
    # report paths are checked before the campaign, and nothing is created for a failed command
    pytest.param(["fuzz", "--cases", "1", "--variant", "bogus", "--json", "{tmp}/r.json"], ["--variant", "bogus"],
                 id="bad variant with --json: no report file created"),
    pytest.param(["fuzz", "--cases", "1", "--json", "{tmp}/no/such/folder/r.json"], ["--json", "existing folder"],
                 id="report in a missing folder"),
    pytest.param(["fuzz", "--cases", "1", "--json", "{tmp}"], ["--json", "a directory"], id="report path is a folder"),
    pytest.param(["fuzz", "--cases", "1", "--dump", "/dev/null"], ["--dump", "expected a folder"],
                 id="dump folder is not a folder"),
    pytest.param(["bench", "--backend", "ref", "--json", "{tmp}/no/r.json"], ["--json", "existing folder"],
                 id="bench: report in a missing folder"),
    pytest.param(["report", "merge", "{tmp}/missing.json"], ["missing.json"], id="report merge: missing file"),
]


@pytest.mark.parametrize("args,fragments", USAGE_CASES)
def test_bad_usage(ropekv_bin, tmp_path, args, fragments):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = sorted(tmp_path.iterdir())
    r = run_cli(ropekv_bin, args)
    check_one_error_line(r, [f.replace("{tmp}", str(tmp_path)) for f in fragments])
    assert sorted(tmp_path.iterdir()) == before, "a failed command left files behind"


# (id, name of the file in golden_files, fragments besides the path)
FILE_CASES = [
    pytest.param("missing", [], id="golden check: missing file"),
    pytest.param("dir", ["expected a golden file (.safetensors) or a folder of .npy files, got a directory without .npy files"],
                 id="golden check: a directory"),
    pytest.param("empty", [], id="golden check: empty file"),
    pytest.param("five_bytes", [], id="golden check: shorter than the header length"),
    pytest.param("truncated_header", [], id="golden check: truncated header"),
    pytest.param("truncated_data", [], id="golden check: truncated tensor data"),
    pytest.param("header_not_json", ["header"], id="golden check: corrupted header (not JSON)"),
    pytest.param("header_length_huge", ["header length"], id="golden check: header length 2^60"),
    pytest.param("unknown_dtype", [], id="golden check: unknown tensor dtype in header"),
]


@pytest.mark.parametrize("name,fragments", FILE_CASES)
def test_unreadable_golden_file(ropekv_bin, golden_files, name, fragments):
    path = golden_files[name]
    before = path.read_bytes() if path.is_file() else None
    r = run_cli(ropekv_bin, ["golden", "check", str(path)])
    check_one_error_line(r, [str(path), *fragments])
    if before is not None:
        assert path.read_bytes() == before, "golden check modified its input"


def test_a_report_that_cannot_be_written_is_an_error(ropekv_bin, tmp_path):
    # /dev/full accepts the open and fails the write: exit 2 and one error line, never exit 0
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "2", "--json", "/dev/full"])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.splitlines()[-1].startswith("ropekv: error: --json: expected a complete write"), r.stderr
    # an earlier report is replaced whole or not at all: a write beside it, then a rename
    report = tmp_path / "r.json"
    report.write_text("earlier")
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "2", "--json", str(report)])
    assert r.returncode == 0, r.stderr
    assert report.read_text().startswith("{") and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_report_merge_of_a_non_json_file(ropekv_bin, golden_files):
    path = golden_files["good"]
    check_one_error_line(run_cli(ropekv_bin, ["report", "merge", str(path)]), [str(path)])


@pytest.fixture(scope="module")
def fuzz_report(ropekv_bin, tmp_path_factory):
    """A valid fuzz report (one case, ref vs ref), as parsed JSON."""
    path = tmp_path_factory.mktemp("reports") / "r.json"
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "1", "--json", str(path)])
    assert r.returncode == 0, r.stderr
    return json.loads(path.read_text())


# (section, key, value, fragments): a count of a report that is not an integer 0..2^40 is
# refused before any conversion (a float beyond int64's range converted to it is undefined).
MERGE_CASES = [
    pytest.param("counts", "passed", 1e300, ["report 1 counts.passed", "1e+300"], id="report merge: count 1e300"),
    pytest.param("counts", "failed", 1.5, ["report 1 counts.failed", "1.5"], id="report merge: count 1.5"),
    pytest.param("skip_reasons", "ref: x", -1e30, ["report 1 skip_reasons.ref: x", "-1e+30"],
                 id="report merge: skip count -1e30"),
]


@pytest.mark.parametrize("section,key,value,fragments", MERGE_CASES)
def test_report_merge_of_a_bad_count(ropekv_bin, fuzz_report, tmp_path, section, key, value, fragments):
    report = copy.deepcopy(fuzz_report)
    report[section][key] = value
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    check_one_error_line(run_cli(ropekv_bin, ["report", "merge", str(path)]), fragments)


def test_report_merge_of_the_valid_report(ropekv_bin, fuzz_report, tmp_path):
    # Control: the rows above fail because of the value, not because the base report is bad.
    path = tmp_path / "r.json"
    path.write_text(json.dumps(fuzz_report))
    r = run_cli(ropekv_bin, ["report", "merge", str(path)])
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr)


def test_the_valid_golden_file_passes(ropekv_bin, golden_files):
    # Control: the damaged files above fail because of the damage, not because the base is bad.
    r = run_cli(ropekv_bin, ["golden", "check", str(golden_files["good"])])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli(ropekv_bin, ["run", "--repro", SMALL_REPRO])
    assert r.returncode == 0, r.stdout + r.stderr
