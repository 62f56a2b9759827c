"""What the Submit page posts. The draft it edits, and the checks made on it
before Submit, are jobs/submit_draft.py's."""

from __future__ import annotations

from django import forms

from jobs.spec import MAX_CONFIG_BYTES


class SubmitForm(forms.Form):
    """What the page posts: the whole config as text, and which view the
    user was in (so a failed submit from the JSON box reopens it)."""

    config = forms.CharField(strip=False, required=False, max_length=MAX_CONFIG_BYTES, widget=forms.Textarea)
    mode = forms.ChoiceField(choices=[("form", "form"), ("json", "json")], required=False)

    def clean_config(self) -> str:
        # Browsers send a textarea's line breaks as CRLF whatever was typed
        # or pasted; store the text as the user sees it.
        return self.cleaned_data["config"].replace("\r\n", "\n")
