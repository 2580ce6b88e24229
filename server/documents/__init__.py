"""Texts and documents, before and after the engine: sentence splitting and casing (text, casing),
markup and its placement (markup, html_tree, aligned, placement), files, office documents and subtitles,
glossaries, language detection, finishing (formatting) and suggestions. No front door, no scheduling."""
