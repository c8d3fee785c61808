"""OpenAI's Responses API (`POST /v1/responses`) on the default model, driven through the
official `openai` SDK (`client.responses.create`, `.parse`, `.stream`) and the OpenAI
Agents SDK. References: the SDK's own pydantic types for every response and streamed
event (validated strictly, not just constructed), OpenAI's documented event order,
transformers' chat template for what the input becomes (token counts), jsonschema for
structured output and tool arguments, and the Agents SDK's run loop for a tool round trip.
"""
import asyncio
import json
import re

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter
from typing import Literal

import server_util
from test_server_openai import _hf_tokenizer

MODEL = "smollm2"
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "name": "get_weather",
                "description": "Current weather in a city", "parameters": WEATHER_PARAMETERS,
                "strict": True}
# A question this model answers briefly at temperature 0, so the stream completes.
SHORT_QUESTION = "What is 2+2? Answer with a number."
EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    server_util.DEFAULT_MODEL = default_model
    log = tmp_path_factory.mktemp("responses") / "serve.log"
    # hermes: SmolLM2's tool-call format, for tool_choice "auto" (the Agents SDK's second
    # turn, after its tool ran).
    with server_util.running(dserve_bin, default_model, "--served-model-name", MODEL,
                             "--threads", 2, "--seed", 0, "--max-model-len", 2048,
                             "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                             log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0,
                         timeout=300)


def create(client, **kw) -> Response:
    """responses.create, with the raw JSON validated against the SDK's Response type."""
    raw = client.responses.with_raw_response.create(model=MODEL, **kw)
    Response.model_validate(raw.http_response.json())
    return raw.parse()


def prompt_tokens(messages, **kw) -> int:
    tok = _hf_tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def raw_post(server, body: dict):
    return server_util.post_json(server, "/v1/responses", body, timeout=60)


def check_usage_and_status(r: Response, max_output_tokens: int):
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert 1 <= u.output_tokens <= max_output_tokens
    if r.status == "incomplete":
        assert u.output_tokens == max_output_tokens
        assert r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed" and r.incomplete_details is None


# ---- create ----------------------------------------------------------------------------

def test_text_input_is_one_user_turn(client):
    question = "Name a colour."
    r = create(client, input=question, max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.store is False and r.max_output_tokens == 12 and r.instructions is None
    assert r.usage.input_tokens == prompt_tokens([{"role": "user", "content": question}])
    check_usage_and_status(r, 12)
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert r.output_text
    # The same conversation through chat completions writes the same text.
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12,
                                          messages=[{"role": "user", "content": question}])
    assert r.output_text == chat.choices[0].message.content


def test_message_list_and_instructions(client):
    items = [
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."},
                                     {"type": "input_text", "text": "Any colour."}]},
        {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
         "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Another one, please."}]},
    ]
    r = create(client, instructions="You are terse.", input=items, max_output_tokens=6,
               temperature=0)
    assert r.instructions == "You are terse."
    # instructions lead as the system message; a developer message is a system message
    # to a chat template; text parts of one message join with newlines, as chat's do.
    want = [{"role": "system", "content": "You are terse."},
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Name a colour.\nAny colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one, please."}]
    assert r.usage.input_tokens == prompt_tokens(want)
    check_usage_and_status(r, 6)


class City(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    is_capital: bool


def test_json_schema_format(client):
    # parse() builds text.format = {type: json_schema, name, schema, strict: true} itself.
    r = client.responses.parse(model=MODEL, input="Which city is the capital of France?",
                               text_format=City, max_output_tokens=40, temperature=0)
    assert r.status == "completed"
    assert r.text.format.type == "json_schema" and r.text.format.strict is True
    schema = r.text.format.schema_
    jsonschema.validate(json.loads(r.output_text), schema)
    assert isinstance(r.output_parsed, City)
    # Sampled too: every output is valid.
    for seed in range(3):
        s = create(client, input="Pick a city.", max_output_tokens=40, temperature=1,
                   extra_body={"seed": seed},
                   text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                    "strict": True}})
        assert s.status == "completed"
        jsonschema.validate(json.loads(s.output_text), schema)


def test_json_object_format(client):
    r = create(client, input="A JSON object with a name.", max_output_tokens=60, temperature=0,
               text={"format": {"type": "json_object"}})
    assert r.text.format.type == "json_object"
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict), r.output_text
    else:
        assert r.output_text.startswith("{"), r.output_text


def test_function_call_then_its_output(client):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    r = create(client, input=[question], tools=[WEATHER_TOOL], tool_choice="required",
               temperature=0)
    assert r.status == "completed"
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    args = json.loads(call.arguments)
    jsonschema.validate(args, WEATHER_PARAMETERS)

    # The round trip as OpenAI's guide writes it: the output items go back as input,
    # followed by the tool's answer.
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    r2 = create(client, input=[question, *r.output, answer], tools=[WEATHER_TOOL],
                tool_choice="none", max_output_tokens=16, temperature=0)
    check_usage_and_status(r2, 16)
    assert [o.type for o in r2.output] == ["message"]
    chat_tool = {"type": "function", "function": {k: WEATHER_TOOL[k] for k in
                                                  ("name", "description", "parameters")}}
    want = [question,
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": call.call_id, "type": "function",
                             "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"}]
    assert r2.usage.input_tokens == prompt_tokens(want, tools=[chat_tool])

    # A named function is forced the same way.
    r3 = create(client, input="Hello", tools=[WEATHER_TOOL], temperature=0,
                tool_choice={"type": "function", "name": "get_weather"})
    assert [o.type for o in r3.output] == ["function_call"]
    jsonschema.validate(json.loads(r3.output[0].arguments), WEATHER_PARAMETERS)


# ---- streaming -------------------------------------------------------------------------

# OpenAI's order: lifecycle events around each output item's own sequence.
MESSAGE_ITEM = (r"response\.output_item\.added response\.content_part\.added "
                r"(response\.output_text\.delta )*response\.output_text\.done "
                r"response\.content_part\.done response\.output_item\.done ")
CALL_ITEM = (r"response\.output_item\.added (response\.function_call_arguments\.delta )+"
             r"response\.function_call_arguments\.done response\.output_item\.done ")


def check_order(types, item_pattern):
    seq = " ".join(types) + " "
    assert re.fullmatch(r"response\.created response\.in_progress (" + item_pattern +
                        r")+response\.completed ", seq), types


def test_stream_events_in_order_and_text_equals_final(client):
    kw = dict(model=MODEL, input=SHORT_QUESTION, max_output_tokens=40, temperature=0)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_order([e.type for e in events], MESSAGE_ITEM)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas
    assert deltas == final.output_text
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == deltas
    assert final.status == "completed"
    assert final.usage.output_tokens >= 1
    # Streamed and not, the same text.
    assert create(client, **{k: v for k, v in kw.items() if k != "model"}).output_text == deltas


def test_stream_events_validate_and_tool_call_arguments_stream(client):
    stream = client.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER_TOOL],
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     temperature=0, stream=True)
    events = list(stream)
    for e in events:
        EVENT.validate_python(e.model_dump(mode="json", exclude_unset=True))
    check_order([e.type for e in events], CALL_ITEM)
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    final = events[-1].response
    [call] = final.output
    assert pieces == done.arguments == call.arguments
    assert call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    assert final.usage.input_tokens == prompt_tokens(
        [{"role": "user", "content": "Weather in Rome?"}])


# ---- the OpenAI Agents SDK -------------------------------------------------------------

@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_runs_a_function_tool(server, streamed):
    import agents
    from agents.models.openai_responses import OpenAIResponsesModel

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append({"city": city})
        return f"Sunny in {city}"

    async def run():
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none",
                                    max_retries=0)
        # The first turn must call the tool; the Agents SDK resets tool_choice after the
        # call, so the second turn answers with the tool's result.
        agent = agents.Agent(
            name="weather", instructions="Use the weather tool.", tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                max_tokens=64))
        if not streamed:
            return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        result = agents.Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert len(calls) == 1
    jsonschema.validate(calls[0], get_weather.params_json_schema)
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds
    call, output = result.new_items[0].raw_item, result.new_items[1].raw_item
    assert call.name == "get_weather" and output["call_id"] == call.call_id
    assert json.loads(call.arguments) == calls[0]
    assert isinstance(result.final_output, str) and result.final_output
    if streamed:
        assert result.is_complete


# ---- what is refused -------------------------------------------------------------------

@pytest.mark.parametrize("body,status,param", [
    ({"input": "hi", "store": True}, 400, "store"),
    ({"input": "hi", "previous_response_id": "resp_123"}, 400, "previous_response_id"),
    ({"input": "hi", "conversation": "conv_1"}, 400, "conversation"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ({}, 400, "input"),
    ({"input": 3}, 400, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     400, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools"),
    ({"input": "hi", "tools": [{"type": "function", "name": ""}]}, 400, "tools"),
    ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": "hi", "tool_choice": {"type": "file_search"}}, 400, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text.format"),
    ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 100000}, 400, "max_output_tokens"),
    ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"input": "hi", "include": ["file_search_call.results"]}, 400, "include"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({"input": "hi", "model": "gpt-5"}, 404, "model"),
])
def test_bad_requests_are_openai_errors(server, body, status, param):
    got, err = raw_post(server, body)
    assert got == status, err
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["param"] == param and err["error"]["message"], err


def test_store_true_is_refused_through_the_sdk_and_false_accepted(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="hi", store=True)
    assert "store" in e.value.message
    r = create(client, input="hi", store=False, max_output_tokens=1)
    assert r.store is False
