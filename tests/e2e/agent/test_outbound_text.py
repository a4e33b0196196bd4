"""End to end: text that leaves gpudiag is redacted (secret shapes) and escaped for its format
(controls, JUnit attributes, HTML, Rich markup in `top`); harmless text is left alone."""

from __future__ import annotations


def test_markup_in_an_argv_does_not_crash_top():
    """A process argv holding `[/x]` crashed anyone's `gpudiag top` (Rich markup)."""
    import asyncio

    from gpudiag.tui.top import TopApp
    from tests.e2e.tui.test_top import procs
    from tests.tui.test_top import NO_GPU

    row = dict(procs([1])[0], command="python [/x] [bold]x --api-key abcdefghij \x1b[2J")
    app = TopApp(lambda: dict(NO_GPU, processes=[row]))

    async def go():
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            shown = " ".join(str(c) for c in app.query_one("#procs").get_row_at(0))
            assert "[/x] [bold]x --api-key ***" in shown and "\x1b" not in shown
            await pilot.press("q")

    asyncio.run(go())
