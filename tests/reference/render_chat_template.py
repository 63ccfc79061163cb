"""Renders chat templates with Jinja2 the way transformers' apply_chat_template
does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, json.dumps-based tojson), as the reference for woq's
interpreter. Usage: render_chat_template.py IN.json OUT.json, where IN holds
{"templates": {name: source}, "cases": [{"messages", "add_generation_prompt",
"bos_token", "eos_token"}]}; OUT gets {name: [{"text": ...} | {"raised": msg} |
{"error": msg}]}."""
import json
import sys

try:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit(77)  # the caller skips: python3-jinja2 is not installed


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = {}
    for name, source in request["templates"].items():
        template = env.from_string(source)
        results = []
        for case in request["cases"]:
            try:
                results.append({"text": template.render(**case)})
            except Raised as e:
                results.append({"raised": str(e)})
            except Exception as e:  # noqa: BLE001 - any template error is a result to compare
                results.append({"error": f"{type(e).__name__}: {e}"})
        out[name] = results
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
