// quantize_groups (matmul.h: one row by the group rule of sym_int4, asym_int4 or sym_int8) over the
// vectors V of one ISA, for matmul_avx2.cc and matmul_avx512.cc to include inside their anonymous
// namespaces (so that each keeps its own copy, compiled with its flags). The bits are the scalar rule's
// (formats/group_rule.h), in any lane order: IEEE min, max, division and rounding to nearest even are
// exact, and a lane starts at +0 and takes a value only when it is strictly beyond (never a -0 over +0).
// The group's scale and zero point come from the formats' own rule(), called once per group.
//
// V provides: kLanes; F (a vector of floats); load(p, left) (lanes past `left` are +0); all_finite(v);
// zero(); set(f); min(v, m) (v < m ? v : m), max(v, m) (v > m ? v : m), abs(v); hmin(v), hmax(v);
// first_abs_equal(v, a, left) (the first lane whose |v| == a, or -1); round_div(v, d) (nearest even of
// v / d); store(q, v, left) (the integers of the first `left` lanes, truncated: v holds integers).

template <class V>
GroupRule fit_group_simd(LowBit type, Int4Range range, const float* x, std::int64_t len) {
  using F = typename V::F;
  if (type == LowBit::kAsymInt4) {
    F lo = V::zero(), hi = V::zero();
    for (std::int64_t j = 0; j < len; j += V::kLanes) {
      const F v = V::load(x + j, len - j);
      lo = V::min(v, lo);
      hi = V::max(v, hi);
    }
    return asym_int4::rule(V::hmin(lo), V::hmax(hi));
  }
  F amax = V::zero();
  for (std::int64_t j = 0; j < len; j += V::kLanes) amax = V::max(V::abs(V::load(x + j, len - j)), amax);
  const float a = V::hmax(amax);
  if (type == LowBit::kSymInt8) return sym_int8::rule(a);
  float first = 0.0f;  // sym_int4: the first value of magnitude a
  for (std::int64_t j = 0; a > 0.0f && j < len; j += V::kLanes) {
    const int lane = V::first_abs_equal(V::load(x + j, len - j), a, len - j);
    if (lane >= 0) {
      first = x[j + lane];
      break;
    }
  }
  return sym_int4::rule(range, a, first);
}

template <class V>
bool quantize_groups_simd(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                          std::int32_t* q, GroupRule* rules) {
  using F = typename V::F;
  for (std::int64_t j = 0; j < cols; j += V::kLanes)
    if (!V::all_finite(V::load(x + j, cols - j))) return false;
  for (std::int64_t g = 0, c0 = 0; c0 < cols; ++g, c0 += group) {
    const std::int64_t len = std::min(group, cols - c0);
    const GroupRule rule = rules[g] = fit_group_simd<V>(type, range, x + c0, len);
    const float d = rule.step();
    if (d == 0.0f) {
      std::fill_n(q + c0, len, rule.zero);
      continue;
    }
    const F dv = V::set(d), z = V::set(static_cast<float>(rule.zero)), lo = V::set(static_cast<float>(rule.lo)),
            hi = V::set(static_cast<float>(rule.hi));
    for (std::int64_t j = 0; j < len; j += V::kLanes) {
      const F r = V::add(V::round_div(V::load(x + c0 + j, len - j), dv), z);
      V::store(q + c0 + j, V::min(V::max(r, lo), hi), len - j);
    }
  }
  return true;
}
