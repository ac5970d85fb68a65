// The problem descriptor: repro round trip, parsing rules and errors, the random generator's
// coverage and bounds.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include "tests/cpp/parse_error.h"
#include "core/error.h"
#include "core/presets.h"
#include "core/problem.h"

using namespace ropekv;

TEST_CASE("repro: parse(to_repro(p)) == p and prints identically, 10000 random problems") {
  for (uint64_t i = 0; i < 10000; ++i) {
    const problem p = random_problem(42, i, 4096);
    const std::string s = p.to_repro();
    const problem q = parse_problem(s);
    if (!(q == p) || q.to_repro() != s) {
      INFO("case " << i << ": " << s);
      INFO("reprinted: " << q.to_repro());
      FAIL("round trip differs");
    }
  }
}

TEST_CASE("repro: canonical key order and default values") {
  const problem d;
  const std::string s = d.to_repro();
  CHECK(s.rfind("tq=1 ts=1 tk=1 h=128 kh=1 dn=512 dr=64 p=4096 bs=64 nb=1 in=bf16 table_dtype=bf16 "
                "pos=i64 slot=i64 qo=bf16 cache=bf16 table=one style=gptj layout=joint "
                "ds_scale=amax order=nope_first scale_conv=divide pad_q=computed pos_oob=error inplace_q=0 "
                "inplace_k=0 k_scale=1 q_scale=1 scales=host q_layout=token_major zero_copy=0 kv_layout=separate "
                "dec_out=none dec=0 row_pad=0 entry_pad=0 block_pad=0 table_pad=0 pad_slots=0 pad_at=tail "
                "positions=random rope_table=random amp=4 seed=1",
                0) == 0);
  CHECK(parse_problem("") == d);
  CHECK(parse_problem("   ") == d);
}

TEST_CASE("repro: any order, any subset, whitespace") {
  const problem p = parse_problem("  h=8\tts=3 tq=2 tk=5  cache=fp8_e4m3fn k_scale=0.1 rope_table=kimi-k2 ");
  problem q;
  q.heads = 8;
  q.tq = 2;
  q.ts = 3;
  q.tk = 5;
  q.cache_dtype = dtype::fp8_e4m3fn;
  q.k_scale = 0.1f;
  q.rope_table = "kimi-k2";
  CHECK(p == q);
  // floats print as the shortest decimal that round-trips
  CHECK(p.to_repro().find(" k_scale=0.1 ") != std::string::npos);
  problem r = q;
  r.k_scale = 1.0f / 3.0f;
  r.amplitude = 0.1 + 0.2;
  CHECK(r.to_repro().find(" k_scale=0.33333334 ") != std::string::npos);
  CHECK(r.to_repro().find(" amp=0.30000000000000004 ") != std::string::npos);
  CHECK(parse_problem(r.to_repro()) == r);
  // uint64 seeds survive
  CHECK(parse_problem("seed=18446744073709551615").seed == UINT64_MAX);
  // operator== sees every field
  problem s = q;
  s.opt.inplace_k = true;
  CHECK(s != q);
  s = q;
  s.table_pad_elems = 1;
  CHECK(s != q);
}

TEST_CASE("repro: errors name the key") {
  std::string msg;
  CHECK(parse_error_arg("tq=1 bogus=3", &msg) == "repro");
  CHECK(msg.find("bogus") != std::string::npos);
  CHECK(msg.find("one of tq, ts, tk") != std::string::npos);
  CHECK(parse_error_arg("tq") == "repro");
  CHECK(parse_error_arg("=4") == "repro");
  CHECK(parse_error_arg("tq=abc", &msg) == "tq");
  CHECK(msg.find("abc") != std::string::npos);
  CHECK(parse_error_arg("tq=1x") == "tq");
  CHECK(parse_error_arg("tq=") == "tq");
  CHECK(parse_error_arg("tq=99999999999999999999999") == "tq");
  CHECK(parse_error_arg("seed=-1") == "seed");
  CHECK(parse_error_arg("k_scale=abc") == "k_scale");
  CHECK(parse_error_arg("k_scale=1.5x") == "k_scale");
  CHECK(parse_error_arg("k_scale=0") == "k_scale");
  CHECK(parse_error_arg("q_scale=-2") == "q_scale");
  CHECK(parse_error_arg("q_scale=nan") == "q_scale");
  CHECK(parse_error_arg("k_scale=inf") == "k_scale");
  CHECK(parse_error_arg("k_scale=1e39") == "k_scale");  // overflows float32 -> inf
  CHECK(parse_error_arg("amp=0") == "amp");
  CHECK(parse_error_arg("in=fp8_e4m3fn") == "in");
  CHECK(parse_error_arg("in=f64") == "in");
  CHECK(parse_error_arg("table_dtype=i32") == "table_dtype");
  CHECK(parse_error_arg("pos=f32") == "pos");
  CHECK(parse_error_arg("slot=u8") == "slot");
  CHECK(parse_error_arg("qo=i64") == "qo");
  CHECK(parse_error_arg("cache=i32") == "cache");
  CHECK(parse_error_arg("style=llama") == "style");
  CHECK(parse_error_arg("layout=paged") == "layout");
  CHECK(parse_error_arg("pad_at=somewhere") == "pad_at");
  CHECK(parse_error_arg("q_layout=x") == "q_layout");
  CHECK(parse_error_arg("inplace_q=2") == "inplace_q");
  CHECK(parse_error_arg("inplace_k=yes") == "inplace_k");
  CHECK(parse_error_arg("scales=device", &msg) == "scales");
  CHECK(msg.find("host|tensor") != std::string::npos);
  CHECK(parse_error_arg("dec_out=kq", &msg) == "dec_out");  // letters in the order q, z, k
  CHECK(msg.find("q, z, k") != std::string::npos);
  CHECK(parse_error_arg("dec_out=qq") == "dec_out");
  CHECK(parse_error_arg("dec_out=") == "dec_out");
  CHECK(parse_error_arg("dec_out=all") == "dec_out");
  CHECK(parse_error_arg("dec=x") == "dec");
  CHECK(parse_error_arg("tq=1 tq=2", &msg) == "tq");
  // constraints
  CHECK(parse_error_arg("tq=5 ts=4 tk=5") == "tq");
  CHECK(parse_error_arg("tq=1 ts=5 tk=4") == "ts");
  CHECK(parse_error_arg("tq=-1") == "tq");
  CHECK(parse_error_arg("tq=3 ts=3 tk=3 dec_out=qz dec=4", &msg) == "dec");  // N > Tq
  CHECK(msg.find("0 .. 3") != std::string::npos);
  CHECK(parse_error_arg("tq=3 ts=3 tk=3 dec_out=q dec=-1") == "dec");
  CHECK(parse_error_arg("tq=3 ts=3 tk=3 dec_out=k dec=2") == "dec");  // no [N, H, ..] output
  CHECK(parse_error_arg("tq=3 ts=3 tk=3 dec=2") == "dec");
  CHECK(parse_error_arg("tq=3 ts=3 tk=3 dec_out=qzk dec=3") == "");
  CHECK(parse_error_arg("tq=3 ts=3 tk=3 dec_out=z dec=0") == "");
  CHECK(parse_error_arg("dr=3") == "dr");
  CHECK(parse_error_arg("dr=0") == "dr");
  CHECK(parse_error_arg("dn=0") == "dn");
  CHECK(parse_error_arg("h=0") == "h");
  CHECK(parse_error_arg("p=0") == "p");
  CHECK(parse_error_arg("bs=0") == "bs");
  CHECK(parse_error_arg("row_pad=-1") == "row_pad");
  CHECK(parse_error_arg("tq=1 ts=1 tk=1 pad_slots=2") == "pad_slots");
  CHECK(parse_error_arg("tq=1 ts=3 tk=3 bs=1 nb=2", &msg) == "nb");
  CHECK(msg.find("nb * bs >= 3") != std::string::npos);
  CHECK(parse_error_arg("tq=1 ts=3 tk=3 bs=1 nb=2 pad_slots=1") == "");  // 2 written slots fit
  CHECK(parse_error_arg("rope_table=llama3") == "rope_table");
  CHECK(parse_error_arg("rope_table=deepseek-v3 p=163840") == "");
  CHECK(parse_error_arg("rope_table=deepseek-v3 p=163841") == "p");
  CHECK(parse_error_arg("rope_table=kimi-k2 p=131073") == "p");
  CHECK(parse_error_arg("h=65536 dn=65536 tq=16777216 ts=16777216 tk=16777216 nb=262144") == "q_nope");
}

TEST_CASE("random_problem: deterministic, always valid, bounded cost, covers every option") {
  CHECK(random_problem(7, 3) == random_problem(7, 3));
  CHECK(random_problem(7, 3) != random_problem(7, 4));
  CHECK(random_problem(7, 3) != random_problem(8, 3));
  CHECK_THROWS_AS(random_problem(1, 0, 0), arg_error);
  CHECK_THROWS_AS(random_problem(1, 0, 4097), arg_error);

  std::map<std::string, std::set<std::string>> seen;
  auto see = [&](const char* key, const std::string& v) { seen[key].insert(v); };
  const int n = 4000;
  int small = 0, over_512 = 0, fp8_scale_odd = 0, preset_full = 0, ts_gt_tq = 0, tk_gt_ts = 0;
  int64_t max_tq = 0;
  std::set<int64_t> heads, block_sizes, dns, drs;
  for (int i = 0; i < n; ++i) {
    const problem p = random_problem(2026, static_cast<uint64_t>(i), 4096);
    CHECK_NOTHROW(check_problem(p));
    CHECK(p.tq * p.heads * (p.dn + p.dr) <= (int64_t{2} << 20));
    CHECK(p.tk <= 4096);
    small += p.tq <= 64;
    over_512 += p.tq > 512;
    max_tq = std::max(max_tq, p.tq);
    ts_gt_tq += p.ts > p.tq;
    tk_gt_ts += p.tk > p.ts;
    heads.insert(p.heads);
    block_sizes.insert(p.block_size);
    dns.insert(p.dn);
    drs.insert(p.dr);
    if (dtype_is_fp8(p.cache_dtype) && p.k_scale != 1.0f && p.k_scale != 0.5f && p.k_scale != 2.0f)
      ++fp8_scale_odd;
    see("tq", p.tq == 0 ? "0" : p.tq == 1 ? "1" : "more");
    see("in", dtype_name(p.in_dtype));
    see("table_dtype", dtype_name(p.table_dtype));
    see("pos", dtype_name(p.pos_dtype));
    see("slot", dtype_name(p.slot_dtype));
    see("qo", dtype_name(p.q_out_dtype));
    see("cache", dtype_name(p.cache_dtype));
    see("table", std::string(to_string(p.table)));
    see("style", std::string(to_string(p.opt.style)));
    see("layout", std::string(to_string(p.opt.layout)));
    if (p.opt.layout == cache_layout::fp8_ds_mla) {
      see("ds_scale", std::string(to_string(p.opt.tile_scale)));
      CHECK(p.cache_dtype == dtype::u8);
      CHECK((p.dn == 512 && p.dr == 64));
    } else {
      CHECK(p.opt.tile_scale == ds_scale::amax);
    }
    see("order", std::string(to_string(p.opt.order)));
    see("scale_conv", std::string(to_string(p.opt.scale)));
    see("pad_q", std::string(to_string(p.opt.padding)));
    see("pos_oob", std::string(to_string(p.opt.positions)));
    see("inplace_q", p.opt.inplace_q ? "1" : "0");
    see("inplace_k", p.opt.inplace_k ? "1" : "0");
    see("q_layout", std::string(to_string(p.q_layout)));
    see("kv_layout", std::string(to_string(p.kv_layout)));
    see("scales", std::string(to_string(p.scales)));
    see("dec_q", p.dec_q_pe ? "1" : "0");
    see("dec_zeros", p.dec_zeros ? "1" : "0");
    see("dec_k", p.dec_k_pe ? "1" : "0");
    if (p.dec_q_pe || p.dec_zeros)
      see("dec_n", p.dec_tokens == 0 ? "0" : p.dec_tokens == p.tq ? "tq" : "between");
    see("row_pad", p.row_pad_elems ? "pad" : "0");
    see("entry_pad", p.entry_pad_elems ? "pad" : "0");
    see("block_pad", p.block_pad_elems ? "pad" : "0");
    see("table_pad", p.table_pad_elems ? "pad" : "0");
    if (p.pad_slots > 0) see("pad_at", std::string(to_string(p.pad_where)));
    see("positions", std::string(to_string(p.positions)));
    see("rope_table", p.rope_table);
    see("amp", p.amplitude >= 100 ? "large" : p.amplitude <= 1 ? "small" : "mid");
    if (p.rope_table != "random" && p.table_rows == yarn_table_rows(find_preset(p.rope_table).yarn))
      ++preset_full;
  }
  CHECK(small >= n * 3 / 4);       // most cases are quick
  CHECK(over_512 > 0);             // ... some are large
  CHECK(max_tq > 2048);
  CHECK(ts_gt_tq > n / 10);        // CUDA-graph padding
  CHECK(tk_gt_ts > n / 10);
  CHECK(fp8_scale_odd > n / 10);
  for (int64_t h : {1, 8, 16, 128}) CHECK(heads.count(h) == 1);
  CHECK(heads.size() > 10);
  for (int64_t b : {1, 16, 64, 3, 37}) CHECK(block_sizes.count(b) == 1);
  for (int64_t d : {8, 24, 100, 512}) CHECK(dns.count(d) == 1);
  for (int64_t d : {2, 4, 6, 16, 64}) CHECK(drs.count(d) == 1);
  CHECK(seen["tq"].size() == 3);
  CHECK(seen["in"].size() == 3);
  CHECK(seen["table_dtype"].size() == 3);
  CHECK(seen["pos"].size() == 2);
  CHECK(seen["slot"].size() == 2);
  CHECK(seen["qo"].size() == 7);
  CHECK(seen["cache"].size() == 8);   // the 7 output dtypes, and u8 (layout fp8_ds_mla)
  CHECK(seen["layout"].size() == 4);  // joint, split, shuffled, fp8_ds_mla
  CHECK(seen["ds_scale"].size() == 2);  // amax and pow2, both with layout fp8_ds_mla
  for (const char* k : {"table", "style", "order", "scale_conv", "pad_q", "pos_oob",
                        "inplace_q", "inplace_k", "scales", "dec_q", "dec_zeros", "dec_k", "q_layout", "kv_layout", "row_pad", "entry_pad",
                        "block_pad", "table_pad"}) {
    INFO(k);
    CHECK(seen[k].size() == 2);
  }
  CHECK(seen["dec_n"].size() == 3);  // N = 0, N = Tq and 0 < N < Tq
  CHECK(seen["pad_at"].size() == 4);
  CHECK(seen["positions"].size() == 3);
  CHECK(seen["rope_table"].size() == 1 + model_presets().size());
  CHECK(seen["amp"].size() == 3);
  CHECK(preset_full > 0);
}

TEST_CASE("repro: decode outputs print and parse back; --pin keeps N <= Tq") {
  for (const char* text : {"tq=4 ts=4 tk=4 dec_out=qzk dec=2", "tq=4 ts=4 tk=4 dec_out=q dec=4",
                           "tq=4 ts=4 tk=4 dec_out=z dec=0", "tq=4 ts=4 tk=4 dec_out=k",
                           "tq=4 ts=4 tk=4 dec_out=zk dec=1", "tq=4 ts=4 tk=4 dec_out=qk dec=3"}) {
    INFO(text);
    const problem p = parse_problem(text);
    CHECK(parse_problem(p.to_repro()) == p);
    CHECK(parse_problem(p.to_repro()).to_repro() == p.to_repro());
  }
  const problem p = parse_problem("tq=4 ts=4 tk=4 dec_out=zk dec=1");
  CHECK(!p.dec_q_pe);
  CHECK(p.dec_zeros);
  CHECK(p.dec_k_pe);
  CHECK(p.dec_tokens == 1);
  CHECK(p.to_repro().find(" dec_out=zk dec=1 ") != std::string::npos);
  CHECK(problem{}.to_repro().find(" dec_out=none dec=0 ") != std::string::npos);
  // pins over random problems: N within [0, Tq], every kind of N, a pinned N raises Tq
  std::set<std::string> kinds;
  for (uint64_t i = 0; i < 400; ++i) {
    const problem r = pin_problem(random_problem(5, i, 64), "dec_out=qzk");
    REQUIRE(r.dec_q_pe);
    REQUIRE(r.dec_zeros);
    REQUIRE(r.dec_k_pe);
    REQUIRE(r.dec_tokens >= 0);
    REQUIRE(r.dec_tokens <= r.tq);
    kinds.insert(r.dec_tokens == 0 ? "0" : r.dec_tokens == r.tq ? "tq" : "between");
    const problem n = pin_problem(random_problem(5, i, 64), "dec=3");
    REQUIRE(n.tq >= 3);
    REQUIRE(n.dec_tokens == 3);
    REQUIRE((n.dec_q_pe && n.dec_zeros && n.dec_k_pe));
    const problem k = pin_problem(random_problem(5, i, 64), "dec_out=k");
    REQUIRE(k.dec_tokens == 0);
  }
  CHECK(kinds.size() == 3);
}

TEST_CASE("repro: layout fp8_ds_mla and ds_scale print and parse back; constraints name the key; --pin fits the free keys") {
  for (const char* text : {"layout=fp8_ds_mla cache=u8", "layout=fp8_ds_mla cache=u8 ds_scale=pow2 in=f16 entry_pad=4 block_pad=12"}) {
    INFO(text);
    const problem p = parse_problem(text);
    CHECK(p.opt.layout == cache_layout::fp8_ds_mla);
    CHECK(parse_problem(p.to_repro()) == p);
    CHECK(parse_problem(p.to_repro()).to_repro() == p.to_repro());
  }
  CHECK(parse_problem("layout=fp8_ds_mla cache=u8 ds_scale=pow2").to_repro().find(" layout=fp8_ds_mla ds_scale=pow2 ") !=
        std::string::npos);
  CHECK(parse_error_arg("layout=fp8_ds_mla") == "cache");            // bf16 cache: not the 656-byte entries
  CHECK(parse_error_arg("ds_scale=pow2") == "ds_scale");              // read by fp8_ds_mla only
  CHECK(parse_error_arg("cache=u8") == "cache");                      // u8 only for fp8_ds_mla
  CHECK(parse_error_arg("layout=fp8_ds_mla cache=u8 dn=100") == "dn");
  CHECK(parse_error_arg("layout=fp8_ds_mla cache=u8 dr=32") == "dr");
  CHECK(parse_error_arg("layout=fp8_ds_mla cache=u8 in=f32") == "in");
  CHECK(parse_error_arg("layout=fp8_ds_mla cache=u8 order=rope_first") == "order");
  CHECK(parse_error_arg("layout=fp8_ds_mla cache=u8 entry_pad=2") == "entry_pad");
  CHECK(parse_error_arg("layout=fp8_ds_mla cache=u8 block_pad=6") == "block_pad");
  std::set<std::string> rules;
  int drawn = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    const problem r = random_problem(9, i, 64);
    const problem p = pin_problem(r, "layout=fp8_ds_mla");
    REQUIRE(p.opt.layout == cache_layout::fp8_ds_mla);
    REQUIRE(p.cache_dtype == dtype::u8);
    REQUIRE((p.dn == 512 && p.dr == 64));
    REQUIRE((p.in_dtype == dtype::bf16 || p.in_dtype == dtype::f16));
    rules.insert(std::string(to_string(p.opt.tile_scale)));
    const problem w = pin_problem(r, "ds_scale=pow2");  // selects the layout too
    REQUIRE(w.opt.layout == cache_layout::fp8_ds_mla);
    REQUIRE(w.opt.tile_scale == ds_scale::pow2);
    // drawn fp8_ds_mla, but a pin rules it out: layout joint, the other keys as drawn
    if (r.opt.layout == cache_layout::fp8_ds_mla) {
      ++drawn;
      for (const char* other : {"layout=joint", "layout=split", "layout=shuffled"}) {  // pinned away from it
        const problem o = pin_problem(r, other);
        REQUIRE(o.opt.layout != cache_layout::fp8_ds_mla);
        REQUIRE(o.cache_dtype == r.in_dtype);
        REQUIRE(o.opt.tile_scale == ds_scale::amax);
      }
      const problem j = pin_problem(r, "dn=100");
      REQUIRE(j.opt.layout == cache_layout::joint);
      REQUIRE(j.opt.tile_scale == ds_scale::amax);
      REQUIRE(j.cache_dtype == r.in_dtype);
    }
  }
  CHECK(rules.size() == 2);  // the drawn rule stays: both occur
  CHECK(drawn > 0);
  CHECK_THROWS_AS(pin_problem(random_problem(9, 0, 64), "layout=fp8_ds_mla dn=100"), arg_error);
}
