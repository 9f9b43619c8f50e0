"""The calculator environment (envs/calculator.py) as pure JAX functions on token ids, for the
character tokenizer (envs/char_tokenizer.py: one id per character): `reset` and `step` run
inside a jitted episode loop (rollout/episodes/pure_jax.py) with no host round-trip per turn.

    spec = CalculatorJax.of(env, tokenizer)        # on the host, once: the template's ids
    state, prompt = reset(spec, a, b)              # (B,) factors -> EnvState, (B, L) ids
    state, delta, delta_len, reward, done = step(spec, state, turn_ids, turn_mask)

`turn_ids` (B, T) are the assistant turn's sampled ids, `turn_mask` True on its text (the ids
the host decodes: the turn without its closing end-of-turn token). Ids the tokenizer does not
know decode to nothing on the host; here they are dropped before reading the turn.

A step reads the turn as the host env does:

* "Answer: N": the leftmost match of the host's regex Answer:\\s*(-?[\\d,]+) not followed by
  e, E, or "." then a digit, e or E (the host's lookahead), ends the episode, reward 1 iff N
  (commas dropped, leading zeros ignored, no minus sign) equals a * b.
* Otherwise, with env.tools, the pythonic tool call: the host's regex
  \\[\\s*[A-Za-z_][\\w.]*\\s*\\(.*\\)\\s*\\] (leftmost start, last closing ")]") locates the
  call's text. If that text is exactly [calculator(expression='X*Y')] (or with double quotes),
  X and Y whole numbers of 1 to spec.operand_digits digits without leading zeros (or "0"), the
  tool message is the digits of X * Y; any other call text gets the fixed message
  ERROR_CONTENT. The episode goes on (reward 0 and done at env.max_turns).
* No answer and no call: done, reward 0.

The delta ids are the template's: environment_delta_ids(...) of the tool message, split once
on the host around its content (the char tokenizer writes each character as one id).

Where this agrees with the host env + environment_delta_ids, id for id (tests/test_env_jax.py):
every answer (right, wrong, with commas, leading zeros, a minus sign, no digits), every turn
without a call, and every call whose text is exactly the form above. It differs only where the
host's message depends on free text: a call of that form with longer numbers, leading zeros
or spaces, another expression, another tool, several calls, or a malformed call: the host's
message says what it computed or what is wrong, this one says ERROR_CONTENT. The state counts
tool_calls and tool_errors (the calls given ERROR_CONTENT).
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.envs.chat import environment_delta_ids, render
from grpo_jax.envs.parsers import parse_pythonic
from grpo_jax.errors import ConfigError

ERROR_CONTENT = "Error: write [calculator(expression='A*B')] with whole numbers."
_WORD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"


class EnvState(NamedTuple):
  """One episode per row: the product a * b as little-endian digits, and the counters."""
  product: jax.Array  # (B, 2d) int32, digit k = the 10^k digit
  turn: jax.Array  # (B,) int32, turns stepped
  tool_calls: jax.Array  # (B,) int32
  tool_errors: jax.Array  # (B,) int32, calls answered with ERROR_CONTENT


@dataclasses.dataclass(frozen=True)
class CalculatorJax:
  """The environment's fixed token pieces (hashable, a jit-static value)."""
  digits: int  # env.digits of a and b
  max_turns: int
  tools: bool
  vocab: int  # ids the tokenizer knows (others decode to nothing)
  prompt_pieces: tuple  # ids tuples and "a" / "b" where a factor's digits go
  delta_head: tuple  # the tool message's delta ids before its content
  delta_tail: tuple  # ... and after it
  error_ids: tuple  # ERROR_CONTENT's ids
  digit_ids: tuple  # ids of "0" .. "9"
  answer_ids: tuple  # "Answer:"
  space_ids: tuple  # what \s matches among the tokenizer's characters
  word_ids: tuple  # [\w.]
  name_start_ids: tuple  # [A-Za-z_]
  chars: dict = dataclasses.field(compare=False, hash=False, default=None)
  operand_digits: int = 6  # the longest X and Y the tool call computes

  @classmethod
  def of(cls, env, tokenizer, operand_digits: int = 0) -> "CalculatorJax":
    """The pieces of the host env `env` (a CalculatorEnv) rendered by `tokenizer` (the char
    tokenizer: one id per character); operand_digits: 0 = 2 * env.digits."""
    if env.parse is not parse_pythonic:
      raise ConfigError("train.experience_source='fused_episodes' reads pythonic tool calls "
                        "only; set env.tool_parser='pythonic'.")
    if not 1 <= env.digits <= 9:
      raise ConfigError(f"env.digits={env.digits}: the JAX calculator holds the factors as "
                        f"int32; use 1 to 9 digits.")
    one = {}
    for c in sorted(set(_WORD + ".,:-*()[]='\" \n")):
      ids = tokenizer.encode(c, add_special_tokens=False)
      if len(ids) != 1:
        raise ConfigError(f"train.experience_source='fused_episodes' reads turns one "
                          f"character per id, but the tokenizer writes {c!r} as {len(ids)} "
                          f"ids; set task.tokenizer='char'.")
      one[c] = ids[0]
    ids_of = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    marks = {"a": "\x00A\x00", "b": "\x00B\x00"}
    first = [{"role": "user", "content": env.question.format(a=marks["a"], b=marks["b"])}]
    text = render(tokenizer, first, env.tools, add_generation_prompt=True)
    pieces = []
    for part in re.split("(\x00[AB]\x00)", text):
      pieces.append(part[1].lower() if part in marks.values() else ids_of(part))
    marker = "7"  # a one-character content, located in the template's delta
    delta = environment_delta_ids(tokenizer, first, "", [
        {"role": "tool", "name": "calculator", "content": marker}], env.tools,
        tokenizer.eos_token)
    at = len(delta) - 1 - delta[::-1].index(one[marker])
    return cls(env.digits, env.max_turns, bool(env.tools), len(tokenizer), tuple(pieces),
               tuple(delta[:at]), tuple(delta[at + 1:]), ids_of(ERROR_CONTENT),
               tuple(one[str(d)] for d in range(10)), ids_of("Answer:"),
               (one[" "], one["\n"]), tuple(one[c] for c in _WORD + "."),
               tuple(one[c] for c in _WORD[:53]), one,
               operand_digits or 2 * env.digits)

  @property
  def delta_width(self) -> int:
    """The widest delta: the template's pieces around the longest content."""
    content = max(len(self.error_ids), 2 * self.operand_digits)
    return len(self.delta_head) + content + len(self.delta_tail)


def _digits_of(x: jax.Array, width: int) -> jax.Array:
  """(B,) non-negative int32 -> (B, width) little-endian decimal digits."""
  return (x[:, None] // (10 ** jnp.arange(width, dtype=jnp.int32))) % 10


def multiply_digits(x: jax.Array, y: jax.Array) -> jax.Array:
  """Schoolbook product of little-endian digit rows (B, K) x (B, K) -> (B, 2K) digits: the
  column sums c_k = sum_{i+j=k} x_i y_j, then the carries from the lowest column up."""
  k = x.shape[1]
  i, j = jnp.arange(k)[:, None, None], jnp.arange(k)[None, :, None]
  same_column = (i + j == jnp.arange(2 * k)[None, None, :]).astype(jnp.int32)
  cols = jnp.einsum("bi,bj,ijc->bc", x, y, same_column)

  def carry_on(carry, col):
    total = col + carry
    return total // 10, total % 10
  return jax.lax.scan(carry_on, jnp.zeros(x.shape[0], jnp.int32), cols.T)[1].T


def reset(spec: CalculatorJax, a: jax.Array, b: jax.Array):
  """Episodes of the problems a * b ((B,) int32 of env.digits digits) -> (EnvState, the
  prompt ids (B, L)): the first messages rendered with the generation prompt, as the host's."""
  a, b = jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32)
  d = spec.digits
  factor = {"a": _digits_of(a, d), "b": _digits_of(b, d)}
  table = jnp.asarray(spec.digit_ids, jnp.int32)
  parts = []
  for piece in spec.prompt_pieces:
    if isinstance(piece, str):
      parts.append(table[factor[piece][:, ::-1]])  # most significant digit first
    else:
      parts.append(jnp.broadcast_to(jnp.asarray(piece, jnp.int32), (a.shape[0], len(piece))))
  zeros = jnp.zeros(a.shape, jnp.int32)
  product = multiply_digits(factor["a"], factor["b"])
  return EnvState(product, zeros, zeros, zeros), jnp.concatenate(parts, axis=1)


def _is(ids, members) -> jax.Array:
  """ids in members (a lookup table; -1 and ids past the table are in none)."""
  table = jnp.zeros(max(members) + 2, bool).at[jnp.asarray(members)].set(True)
  return table[jnp.where((ids >= 0) & (ids <= max(members)), ids, max(members) + 1)]


def _digit(spec: CalculatorJax, ids) -> jax.Array:
  """The digit each id writes (0 for the ids that are not digits)."""
  top = max(spec.digit_ids)
  table = jnp.zeros(top + 2, jnp.int32).at[jnp.asarray(spec.digit_ids)].set(jnp.arange(10))
  return table[jnp.where((ids >= 0) & (ids <= top), ids, top + 1)]


def _next_outside(inside: jax.Array) -> jax.Array:
  """(B, T) -> the first index >= t where `inside` is False (T if none), per position t."""
  t = inside.shape[1]
  index = jnp.where(inside, t, jnp.arange(t, dtype=jnp.int32))
  return jax.lax.cummin(index, axis=1, reverse=True)


def _at(ids: jax.Array, pos: jax.Array) -> jax.Array:
  """ids[b, pos[b, t]] with -1 past the end."""
  t = ids.shape[1]
  got = jnp.take_along_axis(ids, jnp.clip(pos, 0, t - 1), axis=1)
  return jnp.where((pos >= 0) & (pos < t), got, -1)


def _matches(ids: jax.Array, pattern) -> jax.Array:
  """(B, T): ids[t : t + len(pattern)] == pattern."""
  t = ids.shape[1]
  padded = jnp.pad(ids, ((0, 0), (0, len(pattern))), constant_values=-1)
  hit = jnp.ones(ids.shape, bool)
  for k, p in enumerate(pattern):
    hit &= padded[:, k:k + t] == p
  return hit


def _window_is(ids: jax.Array, start: jax.Array, pattern) -> jax.Array:
  """(B,): ids[b, start[b] : start[b] + len(pattern)] == pattern."""
  window = _at(ids, start[:, None] + jnp.arange(len(pattern), dtype=jnp.int32)[None, :])
  return jnp.all(window == jnp.asarray(pattern, jnp.int32)[None, :], axis=1)


def _first(hit: jax.Array):
  """(found (B,), the first index where hit (B,))."""
  return jnp.any(hit, axis=1), jnp.argmax(hit, axis=1).astype(jnp.int32)


def _compact(ids, mask, vocab: int):
  """The ids the host reads, moved to the front (order kept), -1 after them."""
  keep = mask & (ids >= 0) & (ids < vocab)
  order = jnp.argsort(~keep, axis=1, stable=True)
  return jnp.where(jnp.take_along_axis(keep, order, axis=1),
                   jnp.take_along_axis(ids, order, axis=1), -1)


def read_answer(spec: CalculatorJax, ids: jax.Array, product: jax.Array):
  """(found, right) of the leftmost Answer:\\s*(-?[\\d,]+)(?![\\d,eE]|\\.[\\deE]) in ids
  (compacted): right iff the number's digits without commas and leading zeros are the
  product's and it has no sign."""
  pos = jnp.arange(ids.shape[1], dtype=jnp.int32)[None, :]
  c = spec.chars
  space, numeric = _is(ids, spec.space_ids), _is(ids, spec.digit_ids + (c[","],))
  after_space = _at(_next_outside(space), pos + len(spec.answer_ids))
  minus = _at(ids, after_space) == c["-"]
  start = after_space + minus
  end = _at(_next_outside(numeric), start)  # (a digit or comma never follows the number)
  after, then = _at(ids, end), _at(ids, end + 1)
  goes_on = _is(after, (c["e"], c["E"])) | ((after == c["."])
                                            & _is(then, spec.digit_ids + (c["e"], c["E"])))
  hit = (_matches(ids, spec.answer_ids) & (_at(numeric.astype(jnp.int32), start) == 1)
         & ~goes_on)
  found, at = _first(hit)
  s = jnp.take_along_axis(start, at[:, None], axis=1)
  e = _at(_next_outside(numeric), s)
  digit = _digit(spec, ids)
  in_span = (pos >= s) & (pos < e) & _is(ids, spec.digit_ids)
  significant = in_span & (jnp.cumsum(in_span & (digit > 0), axis=1) > 0)
  count = jnp.sum(significant, axis=1)
  width = product.shape[1]
  rank = jnp.where(significant, count[:, None] - jnp.cumsum(significant, axis=1), width)
  number = jnp.full(product.shape, -1, jnp.int32)  # little-endian, -1 past its digits
  number = number.at[jnp.arange(ids.shape[0])[:, None], rank].set(digit, mode="drop")
  length = jnp.max(jnp.where(product > 0, jnp.arange(width)[None, :] + 1, 0), axis=1)
  expected = jnp.where(jnp.arange(width)[None, :] < length[:, None], product, -1)
  signed = jnp.take_along_axis(minus, at[:, None], axis=1)[:, 0]
  right = found & ~signed & (count == length) & jnp.all(number == expected, axis=1)
  return found, right


def find_call(spec: CalculatorJax, ids: jax.Array):
  """(found, start, end) of the host's pythonic call regex in ids (compacted): the leftmost
  "[" opening name( whose "(" precedes the last ")" closing with "]"; end after that "]"."""
  pos = jnp.arange(ids.shape[1], dtype=jnp.int32)[None, :]
  c = spec.chars
  next_text = _next_outside(_is(ids, spec.space_ids))
  name = _at(next_text, pos + 1)
  name_end = _at(_next_outside(_is(ids, spec.word_ids)), name + 1)
  paren = _at(next_text, name_end)
  opens = ((ids == c["["]) & _is(_at(ids, name), spec.name_start_ids)
           & (_at(ids, paren) == c["("]))
  closer = _at(next_text, pos + 1)
  closes = (ids == c[")"]) & (_at(ids, closer) == c["]"])
  last = jnp.max(jnp.where(closes, pos, -1), axis=1)
  found, start = _first(opens & (paren < last[:, None]))
  end = jnp.take_along_axis(closer, jnp.maximum(last, 0)[:, None], axis=1)[:, 0] + 1
  return found, start, end


def _number_at(spec: CalculatorJax, ids, start):
  """(ok, end, little-endian digits (B, K)) of the whole number starting at `start` (B,):
  1 to K digits, no leading zero unless it is "0"."""
  k = spec.operand_digits
  end = _at(_next_outside(_is(ids, spec.digit_ids)), start[:, None])[:, 0]
  length = end - start
  offsets = jnp.arange(k, dtype=jnp.int32)[None, :]
  chars = _at(ids, end[:, None] - 1 - offsets)  # lowest digit first
  digits = _digit(spec, chars)
  digits = jnp.where(offsets < length[:, None], digits, 0)
  lead = _at(ids, start[:, None])[:, 0] == spec.digit_ids[0]
  ok = (length >= 1) & (length <= k) & ~(lead & (length > 1))
  return ok, end, digits


def read_call(spec: CalculatorJax, ids, start, end):
  """(exact, product digits (B, 2K)): whether ids[start:end] is exactly
  [calculator(expression='X*Y')] (either quote, the same at both ends), and X * Y."""
  c = spec.chars
  head = [c[ch] for ch in "[calculator(expression="]
  quote = _at(ids, (start + len(head))[:, None])[:, 0]
  ok_x, x_end, x = _number_at(spec, ids, start + len(head) + 1)
  star = _at(ids, x_end[:, None])[:, 0] == c["*"]
  ok_y, y_end, y = _number_at(spec, ids, x_end + 1)
  ok_tail = ((_at(ids, y_end[:, None])[:, 0] == quote)
             & _window_is(ids, y_end + 1, (c[")"], c["]"])) & (y_end + 3 == end))
  exact = (_window_is(ids, start, head) & ((quote == c["'"]) | (quote == c['"'])) & ok_x & star
           & ok_y & ok_tail)
  return exact, multiply_digits(x, y)


def _delta(spec: CalculatorJax, exact, product):
  """(delta ids (B, D), length (B,)): the template's head, the content (the product's digits
  most significant first, or ERROR_CONTENT), its tail."""
  width = product.shape[1]
  length = jnp.maximum(jnp.max(jnp.where(product > 0, jnp.arange(width) + 1, 0), axis=1), 1)
  pos = jnp.arange(spec.delta_width, dtype=jnp.int32)[None, :]
  digit_ids = jnp.asarray(spec.digit_ids, jnp.int32)
  content_len = jnp.where(exact, length, len(spec.error_ids))[:, None]
  error = jnp.asarray(spec.error_ids, jnp.int32)
  k = pos - len(spec.delta_head)
  written = digit_ids[_at(product, length[:, None] - 1 - k)]
  content = jnp.where(exact[:, None], written, error[jnp.clip(k, 0, len(error) - 1)])
  head, tail = jnp.asarray(spec.delta_head, jnp.int32), jnp.asarray(spec.delta_tail, jnp.int32)
  t = k - content_len
  ids = jnp.where(k < 0, head[jnp.clip(pos, 0, len(head) - 1)],
                  jnp.where(t < 0, content, tail[jnp.clip(t, 0, len(tail) - 1)]))
  total = len(spec.delta_head) + content_len[:, 0] + len(spec.delta_tail)
  return jnp.where(pos < total[:, None], ids, 0), total


def step(spec: CalculatorJax, state: EnvState, turn_ids, turn_mask):
  """One assistant turn of every episode -> (state, delta ids (B, D), delta length (B,),
  reward (B,) float32, done (B,)); see the module docstring for how a turn is read."""
  ids = _compact(jnp.asarray(turn_ids, jnp.int32), jnp.asarray(turn_mask, bool), spec.vocab)
  turn = state.turn + 1
  answered, right = read_answer(spec, ids, state.product)
  found, start, end = find_call(spec, ids)
  calls = found & ~answered & spec.tools
  exact, product = read_call(spec, ids, start, end)
  delta, length = _delta(spec, exact, product)
  done = ~calls | (turn >= spec.max_turns)
  reward = jnp.where(calls, 0.0, right.astype(jnp.float32))
  state = EnvState(state.product, turn, state.tool_calls + calls,
                   state.tool_errors + (calls & ~exact))
  return state, delta, length, reward, done

