"""The agent's tools: what the orchestrator can call, each run by frozen VLM sub-agents.

    registry.default_registry(kb_types=None, skill_names=None) -> ToolRegistry
        .specs()                        stable-order [{name, description, parameters}]
        await .run(ctx, name, args)     -> Observation; model mistakes come back as errors

Tools (coarse to fine): view_full_video, crop_video, select_video_frame, crop_video_frame,
search_surgical_kb, load_skill, final_answer. Helpers: media (plan → decode → MediaItem + FrameRefs
+ visual-token charging), timeline (tolerant time parsing), prompts (sub-agent texts), schema
(bounded JSON-schema fields). The contract is `base.Tool` / `base.ToolContext`.
"""
