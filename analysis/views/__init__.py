"""Interactive views: the HoloViews timeline and overview, the Panel app.

The top floor of the analysis: it may import every other (the app shows the report's findings
beside the timeline). Heavy imports (HoloViews, Bokeh, Panel) stay inside these modules.
"""
