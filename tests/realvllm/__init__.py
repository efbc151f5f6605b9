"""The realvllm tier: real vLLM CPU engines behind the real router."""
