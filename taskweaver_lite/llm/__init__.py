"""The model client: the openai-SDK chat model, streamed replies, reply schemas and repair, token counts, local server discovery."""
