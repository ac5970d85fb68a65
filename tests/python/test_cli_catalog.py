"""The CLI half of the bad-input catalog.

Every row is one bad command line, one unreadable input file or one set of shard reports that
`report merge` must refuse. Each must end the process with
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
    write("trailing_bytes", data + b"xx")
    nul = header.rstrip(b" ") + b"\0" * 8
    nul += b"\0" * ((8 - len(nul) % 8) % 8)
    write("nul_padded_header", struct.pack("<Q", len(nul)) + nul + data[8 + header_len:])
    hj = json.loads(header)
    first = sorted((k for k in hj if k != "__metadata__"), key=lambda k: hj[k]["data_offsets"][0])
    dup = b"{" + json.dumps({first[0]: hj[first[0]]})[1:-1].encode() + b"," + header[1:]
    dup += b" " * ((8 - len(dup) % 8) % 8)
    write("duplicate_key", struct.pack("<Q", len(dup)) + dup + data[8 + header_len:])
    over = dict(hj)
    e = dict(hj[first[1]])
    e["data_offsets"] = [0, e["data_offsets"][1] - e["data_offsets"][0]]
    over[first[1]] = e
    ot = json.dumps(over).encode()
    ot += b" " * ((8 - len(ot) % 8) % 8)
    write("overlapping_offsets", struct.pack("<Q", len(ot)) + ot + data[8 + header_len:])

    def edit_i64(name, tensor, edit):
        b, e = hj[tensor]["data_offsets"]
        vals = list(struct.unpack(f"<{(e - b) // 8}q", data[8 + header_len + b: 8 + header_len + e]))
        edit(vals)
        body = bytearray(data)
        body[8 + header_len + b: 8 + header_len + e] = struct.pack(f"<{len(vals)}q", *vals)
        write(name, bytes(body))

    edit_i64("slot_beyond_cache", "slot_mapping", lambda v: v.__setitem__(0, 10**6))
    edit_i64("slot_twice", "slot_mapping", lambda v: v.__setitem__(1, v[0]))
    edit_i64("position_beyond_table", "positions", lambda v: v.__setitem__(0, 10**6))
    fifo = d / "fifo.safetensors"
    os.mkfifo(fifo)
    files["fifo"] = fifo
    files["dev_zero"] = Path("/dev/zero")
    sparse = d / "sparse.safetensors"
    with open(sparse, "wb") as f:
        f.truncate(12 << 30)  # 12 GiB of holes: refused on its 8-byte header, never read
    files["sparse"] = sparse
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
    # an existing output is replaced only with --force (the pre-existing file is made by the test)
    pytest.param(["golden", "write", "--repro", SMALL_REPRO, "--out", "{tmp}/existing"], ["--out", "--force", "existing file"],
                 id="golden write onto an existing file"),
    pytest.param(["golden", "write", "--repro", SMALL_REPRO, "--format", "npy", "--out", "{tmp}/folder"],
                 ["--out", "folder with files"], id="golden write npy into a non-empty folder"),
    pytest.param(["golden", "write", "--random", "2", "--out", "{tmp}/folder"], ["--out", "folder with files"],
                 id="golden write --random into a non-empty folder"),
    pytest.param(["bench", "--backend", "ref", "--case", "deepseek-v3:1", "--json", "{tmp}/existing"], ["--json", "--force"],
                 id="bench: --json onto an existing file"),
    pytest.param(["golden", "check", "{tmp}/missing.safetensors", "--json", "{tmp}/existing"], ["--json", "--force"],
                 id="golden check: --json onto an existing file"),
    # fuzz --jobs N: N worker processes of shards 0..N-1 (so no --shard, no one-case --repro)
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--shard", "0/2"], ["--jobs", "--shard"],
                 id="fuzz --jobs with --shard"),
    pytest.param(["fuzz", "--jobs", "2", "--repro", SMALL_REPRO], ["--jobs", "--repro"], id="fuzz --jobs with --repro"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "0"], ["--jobs", "decimal integer in 1..", "'0'"], id="fuzz --jobs 0"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "0x2"], ["--jobs", "'0x2'"], id="fuzz --jobs in hex"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "1000000"], ["--jobs", "'1000000'"], id="fuzz --jobs beyond 4 x CPUs"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--backends", "ref,nope"], ["backend", "nope"],
                 id="fuzz --jobs: unknown backend (no worker starts)"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--json", "{tmp}/no/such/r.json"], ["--json", "existing folder"],
                 id="fuzz --jobs: report in a missing folder"),
    # --max-memory SIZE: decimal digits, an optional fraction and unit, 1 byte .. 2^62 bytes
    *[pytest.param(["run", "--repro", SMALL_REPRO, *([f"--max-memory={size}"] if size.startswith("-") else ["--max-memory", size])],
                   ["--max-memory", f"'{size}'", "512MiB"],
                   id=f"--max-memory {size!r}")
      for size in ["", "-1", "1e3", "0x10", "abc", "5XB", "0", "5000000TiB", "1 GiB"]],
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--max-memory", "1e3"], ["--max-memory", "'1e3'"],
                 id="fuzz --jobs: --max-memory checked before any worker starts"),
    # a case over the memory limit: refused before anything is allocated or written
    pytest.param(["run", "--preset", "deepseek-v3", "--tokens", "100000", "--max-memory", "16GiB"],
                 ["--max-memory", "fits in 16.00 GiB", "needs 27.70 GiB", "q_out 13.73 GiB", "q_nope 12.21 GiB", "fewer tokens"],
                 id="--max-memory: run deepseek-v3 x 100000"),
    pytest.param(["run", "--repro", "tq=1 ts=1 tk=16777216 h=64 kh=64 dn=448 dr=64", "--max-memory", "100GiB"],
                 ["--max-memory", "needs 1024.13 GiB", "kv_c 896.00 GiB"], id="--max-memory: a repro with an 896 GiB kv_c"),
    pytest.param(["fuzz", "--backends", "ref,ref", "--repro", SMALL_REPRO, "--max-memory", "1KiB", "--json", "{tmp}/r.json"],
                 ["--max-memory", "fits in 1.0 KiB (--max-memory)", "cache 1.9 KiB in 2 copies"],
                 id="--max-memory: fuzz --repro over the limit"),
    pytest.param(["golden", "write", "--repro", SMALL_REPRO, "--max-memory", "1KiB", "--out", "{tmp}/x.safetensors"],
                 ["--max-memory", "fits in 1.0 KiB"], id="--max-memory: golden write"),
    pytest.param(["golden", "write", "--random", "3", "--max-memory", "1KiB", "--out", "{tmp}/cases"],
                 ["--max-memory", "fits in 1.0 KiB"], id="--max-memory: golden write --random (no folder made)"),
    pytest.param(["bench", "--backend", "ref", "--case", "deepseek-v3:4096", "--max-memory", "100MiB"],
                 ["--max-memory", "fits in 100.0 MiB", "bench fewer tokens"], id="--max-memory: bench case"),
    # integers of every subcommand: empty, out of range, hex, exponent, blanks, non-ASCII digits
    pytest.param(["run", "--preset", "deepseek-v3", "--tokens", ""], ["--tokens", "decimal integer", "got ''"],
                 id="run: empty token count"),
    pytest.param(["run", "--preset", "deepseek-v3", "--tokens", "16777217"], ["--tokens", "1..16777216", "'16777217'"],
                 id="run: tokens 2^24 + 1"),
    pytest.param(["run", "--preset", "deepseek-v3", "--seed", "0x10"], ["--seed", "'0x10'"], id="run: seed in hex"),
    pytest.param(["run", "--preset", "deepseek-v3", "--seed", " 5"], ["--seed", "' 5'"], id="run: seed with a leading blank"),
    pytest.param(["run", "--preset", "deepseek-v3", "--tokens", "4 "], ["--tokens", "'4 '"], id="run: tokens with a trailing blank"),
    pytest.param(["run", "--preset", "deepseek-v3", "--tokens", "\uff15"], ["--tokens", "'\uff15'"],
                 id="run: tokens as a fullwidth digit"),
    pytest.param(["run", "--preset", "deepseek-v3", "--backend", ""], ["backend", "got ''"], id="run: empty backend"),
    pytest.param(["golden", "write", "--preset", "deepseek-v3", "--tokens", "1e3", "--out", "{tmp}/g.safetensors"],
                 ["--tokens", "'1e3'"], id="golden write: tokens with an exponent"),
    pytest.param(["golden", "write", "--random", "0", "--out", "{tmp}/r"], ["--random", "1..1000000", "'0'"],
                 id="golden write: --random 0"),
    pytest.param(["golden", "write", "--random", "1000001", "--out", "{tmp}/r"], ["--random", "'1000001'"],
                 id="golden write: --random beyond the bound"),
    pytest.param(["golden", "write", "--random", "2", "--max-tokens", "4097", "--out", "{tmp}/r"],
                 ["--max-tokens", "1..4096", "'4097'"], id="golden write: max-tokens 4097"),
    pytest.param(["golden", "write", "--preset", "deepseek-v3", "--table-rows", "-1", "--out", "{tmp}/g.safetensors"],
                 ["--table-rows", "'-1'"], id="golden write: table-rows -1"),
    pytest.param(["golden", "write", "--preset", "deepseek-v3", "--seed", "18446744073709551616", "--out",
                  "{tmp}/g.safetensors"], ["--seed", "'18446744073709551616'"], id="golden write: seed 2^64"),
    pytest.param(["golden", "check", "{tmp}/missing.safetensors", "--max-ulp", "4294967297"],
                 ["--max-ulp", "0..4294967296", "'4294967297'"], id="golden check: max-ulp 2^32 + 1"),
    pytest.param(["golden", "compare", "{tmp}/missing.safetensors", "--got", "{tmp}/x", "--max-ulp", "1e3"],
                 ["--max-ulp", "'1e3'"], id="golden compare: max-ulp with an exponent"),
    pytest.param(["fuzz", "--cases", "1", "--max-failures", "1e3"], ["--max-failures", "'1e3'"],
                 id="max-failures with an exponent"),
    pytest.param(["fuzz", "--cases", "1", "--max-tokens", "0"], ["--max-tokens", "1..4096", "'0'"], id="max-tokens 0"),
    pytest.param(["fuzz", "--cases", "1", "--max-ulp", "18446744073709551616"], ["--max-ulp", "'18446744073709551616'"],
                 id="max-ulp 2^64"),
    pytest.param(["fuzz", "--cases", " 5"], ["--cases", "' 5'"], id="cases with a leading blank"),
    pytest.param(["fuzz", "--cases", "1099511627777"], ["--cases", "1..1099511627776", "'1099511627777'"],
                 id="cases 2^40 + 1"),
    pytest.param(["fuzz", "--cases", "1", "--seed", ""], ["--seed", "got ''"], id="empty seed"),
    pytest.param(["fuzz", "--cases", "1", "--seed", "1.0"], ["--seed", "'1.0'"], id="seed 1.0"),
    pytest.param(["fuzz", "--cases", "1", "--shrink-time", "0"], ["--shrink-time", "positive duration", "'0'"],
                 id="shrink-time zero"),
    pytest.param(["fuzz", "--cases", "1", "--shrink-time", "nan"], ["--shrink-time", "'nan'"], id="shrink-time NaN"),
    pytest.param(["fuzz", "--cases", "1", "--time", "1e-400"], ["--time", "'1e-400'"], id="time 1e-400 (underflows to 0)"),
    pytest.param(["fuzz", "--cases", "1", "--time", "5 m"], ["--time", "'5 m'"], id="time with a blank before the unit"),
    pytest.param(["bench", "--backend", "ref", "--calls-per-graph", "0"], ["--calls-per-graph", "1..1000", "'0'"],
                 id="bench: calls-per-graph 0"),
    pytest.param(["bench", "--backend", "ref", "--threads", "0"], ["--threads", "1..1024", "'0'"], id="bench: threads 0"),
    pytest.param(["bench", "--backend", "ref", "--copy-mb", ""], ["--copy-mb", "got ''"], id="bench: empty copy-mb"),
    pytest.param(["bench", "--backend", "ref", "--decode", "18446744073709551616"], ["--decode", "'18446744073709551616'"],
                 id="bench: decode 2^64"),
    pytest.param(["bench", "--backend", "ref", "--budget", ""], ["--budget", "number of seconds", "got ''"],
                 id="bench: empty budget (was read as 0)"),
    pytest.param(["bench", "--backend", "ref", "--budget", "abc"], ["--budget", "number of seconds", "got 'abc'"],
                 id="bench: budget not a number"),
    # --shard forms
    pytest.param(["fuzz", "--cases", "1", "--shard", "4/4"], ["--shard", "4/4"], id="shard K = N"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "-1/4"], ["--shard", "'-1/4'"], id="shard K negative"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "1/4/2"], ["--shard", "'1/4/2'"], id="shard with two slashes"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "/4"], ["--shard", "'/4'"], id="shard without K"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "1/"], ["--shard", "'1/'"], id="shard without N"),
    pytest.param(["fuzz", "--cases", "1", "--shard", "0x1/4"], ["--shard", "'0x1/4'"], id="shard K in hex"),
    pytest.param(["fuzz", "--cases", "1", "--shard", ""], ["--shard", "non-empty"], id="empty shard"),
    # --pin: keys, values, repeats; a value its key never takes is refused before the campaign
    pytest.param(["fuzz", "--cases", "1", "--pin", "foo=1"], ["--pin", "foo"], id="pin: unknown key"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "h=2 h=4"], ["--pin", "each key once", "'h' twice"],
                 id="pin: a key twice"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "h"], ["--pin", "key=value", "'h'"], id="pin: a key without ="),
    pytest.param(["fuzz", "--cases", "1", "--pin", "h=0"], ["h", "1 .. 65536", "got 0"],
                 id="pin: h=0 (every case would be skipped)"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "dr=7"], ["dr", "an even number", "got 7"], id="pin: odd dr"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "in=i32"], ["in", "one of f32, f16, bf16", "got i32"],
                 id="pin: an index dtype as input dtype"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "k_scale=0"], ["k_scale", "finite value > 0", "got 0"],
                 id="pin: k_scale 0"),
    pytest.param(["fuzz", "--cases", "1", "--pin", "rope_table=nope"], ["rope_table", "random, deepseek-v3", "got nope"],
                 id="pin: unknown rope table"),
    pytest.param(["golden", "write", "--random", "2", "--pin", "tq=-1", "--out", "{tmp}/r"], ["tq", "0 .. 16777216", "got -1"],
                 id="golden write: pin tq=-1"),
    # --repro: values and constraints
    pytest.param(["fuzz", "--repro", "kh=3 h=4"], ["kh", "a divisor of h = 4", "got 3"], id="repro: kh not dividing h"),
    pytest.param(["fuzz", "--repro", "in=bf16 qo=f32 zero_copy=1"], ["qo", "bf16 (zero_copy=1", "got f32"],
                 id="repro: zero_copy with q_out in another dtype"),
    pytest.param(["fuzz", "--repro", "zero_copy=2"], ["zero_copy", "got"], id="repro: zero_copy not 0 or 1"),
    pytest.param(["fuzz", "--repro", "seed=18446744073709551616"], ["seed", "'18446744073709551616'"], id="repro: seed 2^64"),
    pytest.param(["fuzz", "--repro", "tq=0x2"], ["tq", "decimal integer", "'0x2'"], id="repro: tq in hex"),
    pytest.param(["fuzz", "--repro", "=5"], ["repro", "key=value", "'=5'"], id="repro: a value without a key"),
    pytest.param(["fuzz", "--repro", "nb=1 bs=1 ts=3 tk=3 tq=2"], ["nb", "nb * bs >= 3", "1 * 1 = 1"],
                 id="repro: a cache smaller than the slots"),
    pytest.param(["fuzz", "--repro", "layout=fp8_ds_mla cache=u8 dn=512 dr=32"], ["dr", "64", "got 32"],
                 id="repro: fp8_ds_mla Dr"),
    pytest.param(["fuzz", "--repro", "pad_slots=4 ts=3 tk=3 tq=2"], ["pad_slots", "0 .. 3", "got 4"],
                 id="repro: more padding slots than slots"),
    pytest.param(["fuzz", "--repro", "amp=nan"], ["amp", "finite value > 0", "nan"], id="repro: amplitude NaN"),
    pytest.param(["fuzz", "--repro", "inplace_q=2"], ["inplace_q", "0 or 1", "'2'"], id="repro: flag 2"),
    # --backends, --variant, named choices
    pytest.param(["fuzz", "--cases", "1", "--backends", "ref,sim,ref"], ["--backends", "two names", "'ref,sim,ref'"],
                 id="backends: three names"),
    pytest.param(["fuzz", "--cases", "1", "--backends", ",ref"], ["--backends", "non-empty items", "',ref'"],
                 id="backends: empty first name"),
    pytest.param(["fuzz", "--cases", "1", "--backends", "ref, sim"], ["backend", "got ' sim'"],
                 id="backends: a blank after the comma"),
    pytest.param(["fuzz", "--cases", "1", "--backends", "REF,sim"], ["backend", "got 'REF'"], id="backends: upper case"),
    pytest.param(["fuzz", "--cases", "1", "--variant", ""], ["--variant", "non-empty", "''"],
                 id="fuzz: empty variant (was read as auto)"),
    pytest.param(["fuzz", "--cases", "1", "--variant", "qp=2"], ["--variant", "qp=0|1", "got qp=2"], id="fuzz: variant qp=2"),
    pytest.param(["fuzz", "--cases", "1", "--numerics", ""], ["--numerics", "fp32, operand-products", "got ''"],
                 id="fuzz: empty numerics"),
    pytest.param(["fuzz", "--cases", "1", "--profile", ""], ["--profile", "any, aligned16", "got ''"], id="fuzz: empty profile"),
    pytest.param(["bench", "--backend", "ref", "--case", ""], ["--case", "PRESET:TOKENS", "got ''"], id="bench: empty case"),
    pytest.param(["bench", "--backend", "ref", "--case", "deepseek-v3:0"], ["--case", "TOKENS", "'0'"],
                 id="bench: case of 0 tokens"),
    pytest.param(["bench", "--backend", "ref", "--case", ":4"], ["preset", "got ''"], id="bench: case without a preset"),
    pytest.param(["bench", "--backend", "ref", "--cache", "u8"], ["--cache", "float dtype", "u8"], id="bench: u8 cache"),
    pytest.param(["bench", "--backend", "ref", "--scales", "device"], ["--scales", "host|tensor", "'device'"],
                 id="bench: unknown scales"),
    pytest.param(["bench", "--backend", "ref", "--mode", "fast"], ["--mode", "copy or zero_copy", "fast"],
                 id="bench: unknown mode"),
    pytest.param(["bench", "--backend", "ref", "--cold"], ["--cold", "the hip backend", "ref"], id="bench: --cold on ref"),
    # paths: empty, folders, missing folders, files where folders belong
    pytest.param(["golden", "check", ""], ["file", "non-empty", "''"], id="golden check: empty file name"),
    pytest.param(["golden", "compare", "{tmp}/missing.safetensors", "--got", ""], ["--got", "non-empty", "''"],
                 id="golden compare: empty --got"),
    pytest.param(["report", "merge", ""], ["reports", "non-empty", "''"], id="report merge: empty file name"),
    pytest.param(["report", "merge", "/dev/null"], ["/dev/null", "regular file", "a character device"],
                 id="report merge: /dev/null"),
    pytest.param(["report", "merge", "{tmp}/existing", "--json", "{tmp}"], ["--json", "a directory"],
                 id="report merge: --json is a folder"),
    pytest.param(["golden", "compare", "{tmp}/missing.safetensors", "--got", "{tmp}/x", "--json", "{tmp}"],
                 ["--json", "a directory"], id="golden compare: --json is a folder"),
    pytest.param(["golden", "check", "{tmp}/missing.safetensors", "--json", "{tmp}/no/such/r.json"],
                 ["--json", "existing folder"], id="golden check: report in a missing folder"),
    pytest.param(["bench", "--backend", "ref", "--json", "{tmp}"], ["--json", "a directory"], id="bench: --json is a folder"),
    pytest.param(["fuzz", "--cases", "1", "--dump", "{tmp}/no/such/dump"], ["--dump", "can be created", "no folder"],
                 id="dump folder under a missing folder"),
    pytest.param(["fuzz", "--cases", "1", "--dump", "{tmp}/existing"], ["--dump", "expected a folder", "not a folder"],
                 id="dump folder is a file"),
    pytest.param(["fuzz", "--cases", "1", "--json", "{tmp}/folder/old.npy"], ["--json", "--force", "existing file"],
                 id="report onto an existing file in a folder"),
    # fuzz --jobs: every option checked before a worker starts
    pytest.param(["fuzz", "--cases", "4", "--jobs", ""], ["--jobs", "non-empty"], id="fuzz --jobs empty"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--pin", "foo=1"], ["--pin", "foo"],
                 id="fuzz --jobs: unknown pin key (no worker starts)"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--dump", "/dev/null"], ["--dump", "expected a folder"],
                 id="fuzz --jobs: dump folder is not a folder"),
    pytest.param(["fuzz", "--cases", "4", "--jobs", "2", "--max-tokens", "5000"], ["--max-tokens", "'5000'"],
                 id="fuzz --jobs: max-tokens beyond the bound"),
]


@pytest.mark.parametrize("args,fragments", USAGE_CASES)
def test_bad_usage(ropekv_bin, tmp_path, args, fragments):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    (tmp_path / "existing").write_text("keep me")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "old.npy").write_text("keep me too")
    before = sorted(tmp_path.iterdir())
    r = run_cli(ropekv_bin, args)
    check_one_error_line(r, [f.replace("{tmp}", str(tmp_path)) for f in fragments])
    assert sorted(tmp_path.iterdir()) == before, "a failed command left files behind"
    assert (tmp_path / "existing").read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["old.npy"]


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
    pytest.param("trailing_bytes", ["size", "2 trailing"], id="golden check: bytes after the last tensor"),
    pytest.param("nul_padded_header", ["header", "padded with spaces"], id="golden check: NUL-padded header"),
    pytest.param("duplicate_key", ["header", "each key once", "twice"], id="golden check: a key twice in the header"),
    pytest.param("overlapping_offsets", ["data_offsets", "no overlap"], id="golden check: overlapping tensor data"),
    pytest.param("slot_beyond_cache", ["slot_mapping[0]", "1000000"], id="golden check: a slot beyond the cache"),
    pytest.param("slot_twice", ["slot_mapping[1]", "unique slot"], id="golden check: a slot twice"),
    pytest.param("position_beyond_table", ["positions[0]", "1000000"], id="golden check: a position beyond the table"),
    pytest.param("fifo", ["a regular file", "a FIFO"], id="golden check: a FIFO (no blocking)"),
    pytest.param("dev_zero", ["a regular file", "a character device"], id="golden check: /dev/zero"),
    pytest.param("sparse", ["header length", "got 0"], id="golden check: a 12 GiB sparse file"),
]


@pytest.mark.parametrize("name,fragments", FILE_CASES)
def test_unreadable_golden_file(ropekv_bin, golden_files, name, fragments):
    path = golden_files[name]
    before = path.read_bytes() if path.is_file() and path.stat().st_size < (1 << 20) else None
    r = run_cli(ropekv_bin, ["golden", "check", str(path)], timeout=20)
    check_one_error_line(r, [str(path), *fragments])
    if before is not None:
        assert path.read_bytes() == before, "golden check modified its input"


# ---------------------------------------------------------------------------- npy golden folders
# A golden case written with --format npy (a folder of NAME.npy plus meta.json), then copies of it
# with one hostile thing each; `golden check FOLDER` must refuse each, naming the file, without
# blocking on a FIFO or reading a device, and leave the folder as it was.

def npy_with_header(data, header):
    """An .npy 1.0 file of `data` (the original's bytes after its header) under a new header dict."""
    text = header.encode("latin1")
    pad = (64 - (10 + len(text) + 1) % 64) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


@pytest.fixture(scope="module")
def npy_folders(ropekv_bin, tmp_path_factory):
    """A valid npy golden folder and damaged copies of it, by name."""
    import shutil
    d = tmp_path_factory.mktemp("npy_catalog")
    good = d / "good"
    r = run_cli(ropekv_bin, ["golden", "write", "--repro", SMALL_REPRO, "--format", "npy", "--out", str(good)])
    assert r.returncode == 0, r.stderr
    raw = (good / "q_nope.npy").read_bytes()
    (hlen,) = struct.unpack("<H", raw[8:10])
    header, data = raw[10:10 + hlen].decode("latin1").strip(), raw[10 + hlen:]
    assert "'descr': '<u2'" in header, header  # bf16 as uint16 bits
    folders = {"good": good}

    def copy(name, edit):
        f = d / name
        shutil.copytree(good, f, symlinks=True)
        edit(f)
        folders[name] = f

    def put(tensor, content):
        return lambda f: (f / f"{tensor}.npy").write_bytes(content)

    def replace_with(tensor, make):
        def apply(f):
            (f / f"{tensor}.npy").unlink()
            make(f / f"{tensor}.npy")
        return apply

    copy("missing_tensor", lambda f: (f / "kv_c.npy").unlink())
    copy("wrong_dtype", put("q_nope", npy_with_header(data, header.replace("'<u2'", "'<i2'"))))
    copy("wrong_element_size", put("q_nope", npy_with_header(data, header.replace("'<u2'", "'<f4'"))))
    copy("truncated_data", put("q_nope", raw[:-3]))
    copy("truncated_header", put("q_nope", raw[:12]))
    copy("bad_magic", put("q_nope", b"\x93NUMPZ" + raw[6:]))
    copy("version_4", put("q_nope", raw[:6] + b"\x04\x00" + raw[8:]))
    copy("fortran_order", put("q_nope", npy_with_header(data, header.replace("False", "True"))))
    copy("shape_too_large", put("q_nope", npy_with_header(data, header.replace("'shape': (", "'shape': (2, "))))
    copy("header_not_a_dict", put("q_nope", npy_with_header(data, "[1, 2, 3]")))
    copy("symlink_to_dev_zero", replace_with("q_nope", lambda p: p.symlink_to("/dev/zero")))
    copy("fifo_tensor", replace_with("q_nope", os.mkfifo))
    copy("folder_tensor", replace_with("q_nope", lambda p: p.mkdir()))
    copy("meta_fifo", lambda f: ((f / "meta.json").unlink(), os.mkfifo(f / "meta.json")))
    copy("meta_not_json", lambda f: (f / "meta.json").write_text("{not json"))
    copy("meta_an_array", lambda f: (f / "meta.json").write_text("[1, 2]"))
    copy("unknown_tensor", put("q_nope_extra", raw))
    return folders


def folder_state(folder):
    return sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
                  for p in folder.iterdir())


# (name of the folder in npy_folders, fragments besides its path)
NPY_CASES = [
    pytest.param("missing_tensor", ["tensor kv_c", "present or derived", "got missing"], id="npy: a tensor file missing"),
    pytest.param("wrong_dtype", ["q_nope.npy", "expected <u2 (for bf16)", "got <i2"], id="npy: another dtype of the same size"),
    pytest.param("wrong_element_size", ["q_nope.npy", "256 bytes", "of <f4", "got 128 bytes"],
                 id="npy: a dtype of another size"),
    pytest.param("truncated_data", ["q_nope.npy", "expected 128 bytes", "got 125 bytes (truncated)"],
                 id="npy: truncated data"),
    pytest.param("truncated_header", ["q_nope.npy", "header length", "(truncated)"], id="npy: truncated header"),
    pytest.param("bad_magic", ["q_nope.npy", "magic", "got other bytes"], id="npy: bad magic"),
    pytest.param("version_4", ["q_nope.npy", "version", "got 4.0"], id="npy: format version 4.0"),
    pytest.param("fortran_order", ["q_nope.npy", "fortran_order", "got True"], id="npy: Fortran order"),
    pytest.param("shape_too_large", ["q_nope.npy", "shape [2,2,2,16]", "got 128 bytes"],
                 id="npy: a shape larger than the data"),
    pytest.param("header_not_a_dict", ["q_nope.npy", "header", "expected '{'"], id="npy: header not a dict"),
    pytest.param("symlink_to_dev_zero", ["q_nope.npy", "a regular file", "a character device"],
                 id="npy: a tensor that links to /dev/zero"),
    pytest.param("fifo_tensor", ["q_nope.npy", "a regular file", "a FIFO"], id="npy: a FIFO named like a tensor (no blocking)"),
    pytest.param("folder_tensor", ["q_nope.npy", "a regular file", "a directory"], id="npy: a folder named like a tensor"),
    pytest.param("meta_fifo", ["meta.json", "a regular file", "a FIFO"], id="npy: meta.json a FIFO (no blocking)"),
    pytest.param("meta_not_json", ["meta.json", "a JSON object", "not JSON"], id="npy: meta.json not JSON"),
    pytest.param("meta_an_array", ["meta.json", "a JSON object", "got a JSON array"], id="npy: meta.json an array"),
    pytest.param("unknown_tensor", ["q_nope_extra", "dtype", "got none"], id="npy: an extra tensor file"),
]


@pytest.mark.parametrize("name,fragments", NPY_CASES)
def test_unreadable_npy_golden_folder(ropekv_bin, npy_folders, name, fragments):
    folder = npy_folders[name]
    before = folder_state(folder)
    r = run_cli(ropekv_bin, ["golden", "check", str(folder)], timeout=20)
    check_one_error_line(r, [str(folder), *fragments])
    assert folder_state(folder) == before, "golden check modified its input"


def test_the_valid_npy_folder_passes(ropekv_bin, npy_folders):
    r = run_cli(ropekv_bin, ["golden", "check", str(npy_folders["good"])])
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_report_that_cannot_be_written_is_an_error(ropekv_bin, tmp_path):
    # /dev/full accepts the open and fails the write: exit 2 and one error line, never exit 0
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "2", "--json", "/dev/full"])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.splitlines()[-1].startswith("ropekv: error: --json: expected a complete write"), r.stderr
    # an earlier report is replaced whole or not at all: a write beside it, then a rename
    report = tmp_path / "r.json"
    report.write_text("earlier")
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "2", "--json", str(report)])
    check_one_error_line(r, ["--json", "--force", str(report)])  # an existing report is kept unless asked
    assert report.read_text() == "earlier"
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "2", "--json", str(report), "--force"])
    assert r.returncode == 0, r.stderr
    assert report.read_text().startswith("{") and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def with_repro(path, out, change):
    """A copy of a golden file whose __metadata__.repro has the keys of `change` set (tensors unchanged)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    repro = header["__metadata__"]["repro"]
    for key_value in change.split():
        key = key_value.split("=")[0]
        repro = " ".join(key_value if t.split("=")[0] == key else t for t in repro.split())
    header["__metadata__"]["repro"] = repro
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text.encode() + data[8 + n:])
    return out


def test_golden_check_over_the_memory_limit(ropekv_bin, golden_files, tmp_path):
    # the limit is checked from the file's header, before any tensor is read: a small file whose
    # repro pads every cache entry and block (the same logical tensors, buffers of 2 x 1 MiB)
    padded = with_repro(golden_files["good"], tmp_path / "padded.safetensors", "entry_pad=65536 block_pad=65536")
    before = sorted(tmp_path.iterdir())
    for cmd in (["golden", "check", str(padded), "--backend", "ref"],
                ["golden", "compare", str(padded), "--got", str(golden_files["good"])]):
        r = run_cli(ropekv_bin, [*cmd, "--max-memory", "512KiB"])
        check_one_error_line(r, ["--max-memory", "fits in 512.0 KiB", "cache", "in 2 copies", "golden file tensors", "smaller file"])
        assert sorted(tmp_path.iterdir()) == before, "a failed command left files behind"
    # controls: the unpadded file fits the same limit; the padded one fits a larger one
    r = run_cli(ropekv_bin, ["golden", "check", str(golden_files["good"]), "--max-memory", "512KiB"])
    assert r.returncode == 0, r.stderr
    r = run_cli(ropekv_bin, ["golden", "check", str(padded), "--max-memory", "64MiB"])
    assert r.returncode == 0, r.stderr


def test_fuzz_skips_drawn_cases_over_the_memory_limit(ropekv_bin):
    # a drawn case over the limit is SKIPPED (grouped under one reason), not an error
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "3", "--max-memory", "1KiB"])
    assert r.returncode == 0, r.stderr
    assert "skipped 3x: the case needs more memory than 1.0 KiB (--max-memory)" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1] == "0 passed, 0 failed, 3 skipped"


def test_an_allocation_that_fails_is_one_error_line(ropekv_bin):
    # past the budget check (a limit raised by hand), a failing allocation names its buffer
    import resource
    if b"__asan_init" in Path(ropekv_bin).read_bytes():
        pytest.skip("an AddressSanitizer build maps terabytes of shadow memory: RLIMIT_AS cannot apply to it")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    r = subprocess.run([ropekv_bin, "run", "--preset", "deepseek-v3", "--tokens", "4096", "--max-memory", "1TiB"],
                       capture_output=True, text=True, timeout=60, env=CLEAN_ENV, preexec_fn=limit)
    check_one_error_line(r, ["out of memory allocating case buffer", "--max-memory"])


def test_report_merge_of_a_non_json_file(ropekv_bin, golden_files):
    path = golden_files["good"]
    check_one_error_line(run_cli(ropekv_bin, ["report", "merge", str(path)]), [str(path)])


# ---------------------------------------------------------------------------- report merge
# Reports no campaign can have written. The bad reports are real shard reports of
# `fuzz --backends ref,ref --cases 6` with one thing changed; merge must refuse each: exit 2,
# one stderr line naming the report file, nothing written.

def fuzz_shard_report(ropekv_bin, folder, k, n):
    path = folder / f"shard-{k}-of-{n}.json"
    r = run_cli(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "6", "--max-tokens", "8", "--seed", "3",
                             "--shard", f"{k}/{n}", "--json", str(path)])
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def shard_reports(ropekv_bin, tmp_path_factory):
    """Real shard reports by shard count: {2: [shard 0/2, shard 1/2], 4: [...]}."""
    d = tmp_path_factory.mktemp("merge_catalog")
    return {n: [fuzz_shard_report(ropekv_bin, d, k, n) for k in range(n)] for n in (2, 4)}


def listed_case(index, outcome="FAILED"):
    return {"index": index, "outcome": outcome, "repro": SMALL_REPRO,
            "replay": f"ropekv fuzz --backends ref,ref --repro '{SMALL_REPRO}'", "message": "edited in",
            "shrunk_repro": None, "shrunk_replay": None, "shrink_steps": 0, "variant": "", "seconds": 0.0,
            "dumped_to": None, "regions": []}


def with_failure(r, index=None, outcome="FAILED", count=True):
    """One passed case of the shard turned into a listed failure (as a failing run reports it)."""
    index = r["shards"][0]["index"] if index is None else index
    if count:
        r["counts"]["passed"] -= 1
        r["counts"][outcome.lower()] += 1
    r["cases"].append(listed_case(index, outcome))
    return r


def stopped_after(r, cases_run):
    """Shard k/N as if it ran only its first `cases_run` cases, all passed."""
    k, n = r["shards"][0]["index"], r["shards"][0]["count"]
    r["shards"][0].update(cases_run=cases_run, next_case=(cases_run - 1) * n + k + 1 if cases_run else 0)
    r["counts"].update(passed=cases_run, total=cases_run)
    excess = sum(r["variants"].values()) - cases_run  # the kernel families of the cases not run
    for family in sorted(r["variants"]):
        drop = min(excess, r["variants"][family])
        r["variants"][family] -= drop
        excess -= drop
    return r


def edit(fn):
    def apply(r):
        fn(r)
        return r
    return apply


class ReportFiles:
    """Writes (edited copies of) the real shard reports into one folder."""

    def __init__(self, reports, folder):
        self.reports, self.folder, self.count = reports, folder, 0

    def shard(self, k, n=2, change=None, text=None):
        self.count += 1
        path = self.folder / f"r{self.count}-shard-{k}-of-{n}.json"
        r = copy.deepcopy(self.reports[n][k])
        if change is not None:
            r = change(r)
        path.write_text(text if text is not None else json.dumps(r, indent=1))
        return path

    def pair(self, change0=None, change1=None):
        """Shards 0/2 and 1/2 (the merge of both is complete); the first named in errors."""
        return [self.shard(0, 2, change0), self.shard(1, 2, change1)]


def bad_merge(build, fragments, named=0, args=()):
    """A row: build(files) -> list of report paths; the error names paths[named] (or all of them
    when named is None) and contains the fragments."""
    return build, fragments, named, list(args)


def pair_where(change, which=0):
    return lambda f: f.pair(change if which == 0 else None, change if which == 1 else None)


# (id: build the reports, fragments, index of the report the error names)
MERGE_CASES = [
    pytest.param(*bad_merge(lambda f: [f.shard(0, 4), f.shard(1, 4), f.shard(3, 4)],
                            ["expected shards 0..3 of 4", "got 0, 1, 3 (missing 2)"], named=None),
                 id="merge: a shard missing"),
    pytest.param(*bad_merge(lambda f: [f.shard(0, 2), f.shard(0, 4)], ["expected shards of 2", "got shard 0/4"], named=1),
                 id="merge: shards of two counts"),
    pytest.param(*bad_merge(lambda f: [f.shard(0), f.shard(0), f.shard(1)], ["each shard of 2 once", "shard 0/2 twice"],
                            named=1),
                 id="merge: a shard twice"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(passed=-1))), ["counts.passed", "got -1"]),
                 id="merge: negative count"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(failed=1e300))), ["counts.failed", "got 1e+300"]),
                 id="merge: count 1e300 (a float)"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(passed=3.0))), ["counts.passed", "got 3.0"]),
                 id="merge: count 3.0 (a float)"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(skipped=2 ** 63))),
                            ["counts.skipped", "0..9223372036854775807", "got 9223372036854775808"]),
                 id="merge: count 2^63"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(passed=2 ** 63 - 1, failed=1, total=0)), 1),
                            ["counts", "beyond 2^63-1"], named=1),
                 id="merge: counts whose sum overflows"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(total=4))), ["counts.total 3", "got 4"]),
                 id="merge: total not the sum of the counts"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(passed=4, total=4))),
                            ["counts.total 3 (the sum of shards[].cases_run)", "got 4"]),
                 id="merge: counts beyond the cases run"),
    pytest.param(*bad_merge(pair_where(lambda r: stopped_after(r, 2)), ["shards[0].cases_run 3", "config.cases 6", "got 2"]),
                 id="merge: a shard that stopped early"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["shards"][0].update(next_case=4))),
                            ["shards[0].next_case 5", "got 4"]),
                 id="merge: next_case not after the cases run"),
    pytest.param(*bad_merge(pair_where(lambda r: with_failure(r, count=False)),
                            ["at most 0 listed FAILED cases (counts.failed)", "got 1"]),
                 id="merge: more listed cases than counted"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["counts"].update(passed=2, errored=1))),
                            ["1 listed ERRORED cases (counts.errored", "got 0"]),
                 id="merge: fewer listed cases than counted (below the cap)"),
    pytest.param(*bad_merge(pair_where(lambda r: with_failure(r, index=1)), ["cases[0].index", "got 1"]),
                 id="merge: a listed case of another shard"),
    pytest.param(*bad_merge(pair_where(lambda r: with_failure(r, index=6)), ["cases[0].index", "got 6"]),
                 id="merge: a listed case beyond the shard's next_case"),
    pytest.param(*bad_merge(pair_where(lambda r: with_failure(with_failure(r, index=2), index=2)),
                            ["each case listed once", "case 2 twice"]),
                 id="merge: a case listed twice"),
    pytest.param(*bad_merge(pair_where(lambda r: with_failure(r, outcome="PASSED")), ["cases[0].outcome", "\"PASSED\""]),
                 id="merge: a passed case listed"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["skip_reasons"].update({"ref: edited in": 1}))),
                            ["skip_reasons summing to counts.skipped 0", "got 1"]),
                 id="merge: skip_reasons not summing to skipped"),
    pytest.param(*bad_merge(lambda f: f.pair(lambda r: stopped_after(edit(lambda q: q["config"].update(max_failures=1))(r), 2),
                                             edit(lambda r: r["config"].update(max_failures=1))),
                            ["at least 1 FAILED/ERRORED cases", "got 0"]),
                 id="merge: --max-failures shard stopped without a failure"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r.update(interrupted=True)), 1),
                            ["--allow-interrupted", "got \"interrupted\": true"], named=1),
                 id="merge: an interrupted campaign"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r.update(interrupted="yes"))), ["interrupted: true or false", "\"yes\""]),
                 id="merge: interrupted not a boolean"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r["config"].update(seed=4)), 1), ["config.seed 3 (as in", "got 4"],
                            named=1),
                 id="merge: configs of two campaigns"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r.update(contract_version=r["contract_version"] + 1)), 1),
                            ["contract_version"], named=1),
                 id="merge: contract versions differ"),
    pytest.param(*bad_merge(pair_where(edit(lambda r: r.pop("counts"))), ["counts present", "got none"]),
                 id="merge: counts missing"),
    pytest.param(*bad_merge(pair_where(lambda r: [1, 2, 3]), ["a ropekv fuzz report", "got an array of 3"]),
                 id="merge: not a fuzz report"),
    pytest.param(*bad_merge(lambda f: [f.shard(0, text="[" * 100 + "]" * 100), f.shard(1)], ["nested at most 64 deep"]),
                 id="merge: JSON nested 100 deep"),
]


@pytest.mark.parametrize("build,fragments,named,extra", MERGE_CASES)
def test_report_merge_refuses(ropekv_bin, shard_reports, tmp_path, build, fragments, named, extra):
    inputs = tmp_path / "in"
    inputs.mkdir()
    files = build(ReportFiles(shard_reports, inputs))
    before = {p: p.read_bytes() for p in files}
    out = tmp_path / "merged.json"
    r = run_cli(ropekv_bin, ["report", "merge", *map(str, files), "--json", str(out), *extra])
    check_one_error_line(r, [*fragments, *(map(str, files) if named is None else [str(files[named])])])
    assert not out.exists() and sorted(tmp_path.iterdir()) == [inputs], "a refused merge wrote something"
    assert {p: p.read_bytes() for p in files} == before, "report merge modified its input"


def special_file(kind, tmp_path):
    if kind == "fifo":
        p = tmp_path / "fifo.json"
        os.mkfifo(p)  # no writer: reading it would block forever
        return p
    if kind == "dir":
        p = tmp_path / "folder.json"
        p.mkdir()
        return p
    if kind == "large":
        p = tmp_path / "large.json"
        with open(p, "wb") as f:
            f.truncate(64 * 1024 * 1024 + 1)  # sparse: 64 MiB + 1 byte of zeros
        return p
    return Path("/dev/zero")  # endless: reading it would never end


# (kind of file, fragments besides its path): refused without reading it, let alone blocking on it
SPECIAL_FILE_CASES = [
    pytest.param("fifo", ["expected a readable regular file", "got a FIFO"], id="merge: a FIFO"),
    pytest.param("dir", ["got a directory"], id="merge: a directory"),
    pytest.param("zero", ["got a character device"], id="merge: /dev/zero"),
    pytest.param("large", ["at most 67108864 bytes", "got 67108865 bytes"], id="merge: a file over 64 MiB"),
]


@pytest.mark.parametrize("kind,fragments", SPECIAL_FILE_CASES)
def test_report_merge_refuses_a_file_that_is_no_report(ropekv_bin, shard_reports, tmp_path, kind, fragments):
    inputs = tmp_path / "in"
    inputs.mkdir()
    bad = special_file(kind, inputs)
    good = ReportFiles(shard_reports, inputs).shard(1)
    out = tmp_path / "merged.json"
    r = run_cli(ropekv_bin, ["report", "merge", str(good), str(bad), "--json", str(out)], timeout=30)
    check_one_error_line(r, [str(bad), *fragments])
    assert not out.exists()


def test_report_merge_controls(ropekv_bin, shard_reports, tmp_path):
    # the unedited shards merge; so do the edits above where they keep a report consistent
    f = ReportFiles(shard_reports, tmp_path)
    out = tmp_path / "m.json"
    r = run_cli(ropekv_bin, ["report", "merge", *map(str, f.pair()), "--json", str(out)])
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    assert m["counts"]["total"] == 6 and m["interrupted"] is False
    assert [sh["index"] for sh in m["shards"]] == [0, 1]
    # a listed failure on its shard (exit 1: the campaign has a failure)
    r = run_cli(ropekv_bin, ["report", "merge", *map(str, f.pair(None, lambda r: with_failure(r, index=3)))])
    assert r.returncode == 1, r.stderr
    assert "case 3: FAILED edited in" in r.stdout and r.stdout.splitlines()[-1] == "5 passed, 1 failed"
    # a --max-failures shard that stopped right after its failure
    def stopped_at_failure(r):
        stopped_after(edit(lambda q: q["config"].update(max_failures=1))(r), 2)
        return with_failure(r, index=2)
    r = run_cli(ropekv_bin, ["report", "merge", *map(str, f.pair(stopped_at_failure,
                                                                   edit(lambda q: q["config"].update(max_failures=1))))])
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines()[-1] == "4 passed, 1 failed"
    # an interrupted shard with --allow-interrupted: the merged report says so
    files = f.pair(None, lambda r: stopped_after(edit(lambda q: q.update(interrupted=True))(r), 1))
    r = run_cli(ropekv_bin, ["report", "merge", *map(str, files), "--allow-interrupted", "--json", str(out), "--force"])
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["interrupted"] is True
    assert "interrupted" in r.stdout


def test_the_valid_golden_file_passes(ropekv_bin, golden_files):
    # Control: the damaged files above fail because of the damage, not because the base is bad.
    r = run_cli(ropekv_bin, ["golden", "check", str(golden_files["good"])])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli(ropekv_bin, ["run", "--repro", SMALL_REPRO])
    assert r.returncode == 0, r.stdout + r.stderr
