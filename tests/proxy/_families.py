"""What each family's model generates (its native output format), for the family tests.

``native(family, parsed)`` is the text a model of that family emits after its generation
prompt for the reply ``parsed``, plus the stop token it ends with. Written from the families'
format descriptions (the same ones trialflow.families' templates follow); these are the
model's own formats, which for several families differ from how the template renders the
same message in the history (gpt-oss header order and ``<|return|>``, Qwen3's empty think
block, DeepSeek's dropped reasoning).
"""

from __future__ import annotations

import json

from proxy.chat import ParsedOutput

BUILTIN = ("brave_search", "wolfram_alpha")


def native(family: str, p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    calls = p.tool_calls
    r, c = p.reasoning or "", p.content or ""
    if family in ("qwen25", "qwen3", "tiny"):
        body = (f"<think>\n{r}\n</think>\n\n" if r and family != "qwen25" else "") + c
        for i, tc in enumerate(calls):
            sep = "\n" if (c or i) else ""
            call = json.dumps({"name": tc.name, "arguments": tc.arguments})
            body += f"{sep}<tool_call>\n{call}\n</tool_call>"
        return body, "<|im_end|>"
    if family == "qwen3_coder":
        body = c
        for i, tc in enumerate(calls):
            body += "\n\n" if (i == 0 and c) else "\n" if i else ""
            params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in tc.arguments.items())
            body += f"<tool_call>\n<function={tc.name}>\n{params}</function>\n</tool_call>"
        return body, "<|im_end|>"
    if family == "glm45":
        body = f"\n<think>{r}</think>" + (f"\n{c}" if c else "")
        for tc in calls:
            args = "".join(
                f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>" for k, v in tc.arguments.items()
            )
            body += f"\n<tool_call>{tc.name}{args}\n</tool_call>"
        return body, "<|observation|>" if calls else "<|user|>"
    if family == "deepseek_v31":
        body = (f"{r}</think>" if thinking and r else "") + c
        if calls:
            body += "<｜tool▁calls▁begin｜>" + "".join(
                f"<｜tool▁call▁begin｜>{tc.name}<｜tool▁sep｜>{json.dumps(tc.arguments)}<｜tool▁call▁end｜>"
                for tc in calls
            )
            body += "<｜tool▁calls▁end｜>"
        return body, "<｜end▁of▁sentence｜>"
    if family == "gpt_oss":
        body = f"<|channel|>analysis<|message|>{r}<|end|><|start|>assistant" if r else ""
        if calls:  # more than one is not what gpt-oss does (it stops at <|call|>), but a parser may see it
            body += "<|call|><|start|>assistant".join(
                f"<|channel|>commentary to=functions.{tc.name} <|constrain|>json<|message|>"
                f"{json.dumps(tc.arguments, separators=(',', ':'))}"
                for tc in calls
            )
            return body, "<|call|>"
        return body + f"<|channel|>final<|message|>{c}", "<|return|>"
    if family == "llama31":
        if len(calls) > 1:  # Llama-3.1 emits one call per turn; "; "-joined JSON is seen in the wild
            return "; ".join(
                json.dumps({"name": tc.name, "parameters": tc.arguments}) for tc in calls
            ), "<|eot_id|>"
        if calls:
            (tc,) = calls
            if tc.name in BUILTIN:
                args = ", ".join(f'{k}="{v}"' for k, v in tc.arguments.items())
                return f"<|python_tag|>{tc.name}.call({args})", "<|eom_id|>"
            return json.dumps({"name": tc.name, "parameters": tc.arguments}), "<|eot_id|>"
        return c, "<|eot_id|>"
    raise KeyError(family)
