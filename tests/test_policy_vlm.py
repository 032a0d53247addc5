

def test_openai_client_counts_the_image_before_sending(server) -> None:
    """With the processor the client's context check includes the image's tokens: a chat that fits
    only without them is refused locally, without a request."""
    from agent_envs.policy.base import CONTEXT_LENGTH_EXCEEDED
    from agent_envs.policy.openai import OpenAIPolicy

    processor = server.policy.processor
    prompt = OpenAIPolicy(server.url, "tiny-vlm", processor=processor).counter.prompt_tokens(chat(page("x")))
    client = OpenAIPolicy(server.url, "tiny-vlm", processor=processor, max_model_len=prompt + 11)
    before = len(server.received)
    refused, fits = client.generate([req(page("x"), max_tokens=12), req(page("x"), max_tokens=11)])
    assert refused.error == CONTEXT_LENGTH_EXCEEDED and fits.ok and fits.prompt_tokens == prompt
    assert len(server.received) == before + 1  # only the request that fits was sent
    client.close()
