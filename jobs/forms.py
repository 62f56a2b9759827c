"""What the Submit page posts. The draft it edits, and the checks made on it
before Submit, are jobs/submit_draft.py's."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import ProhibitNullCharactersValidator

from jobs.spec import MAX_CONFIG_BYTES, SpecProblem


class _ConfigText(forms.CharField):
    """The config box: a NUL is refused by SubmitForm, which says where it
    is (Django's own check says only "Null characters are not allowed")."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.validators = [v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)]


class SubmitForm(forms.Form):
    """What the page posts: the whole config as text, and which view the
    user was in (so a failed submit from the JSON box reopens it)."""

    config = _ConfigText(strip=False, required=False, max_length=MAX_CONFIG_BYTES, widget=forms.Textarea)
    mode = forms.ChoiceField(choices=[("form", "form"), ("json", "json")], required=False)

    def clean_config(self) -> str:
        # Browsers send a textarea's line breaks as CRLF whatever was typed
        # or pasted; store the text as the user sees it.
        text = self.cleaned_data["config"].replace("\r\n", "\n")
        at = text.find("\x00")
        if at >= 0:  # no database keeps it, in a comment or anywhere else
            line_start = text.rfind("\n", 0, at) + 1
            raise ValidationError("the text may not contain the NUL character (\\u0000); remove it", code="nul",
                                  params={"line": text.count("\n", 0, at) + 1, "column": at - line_start + 1})
        return text


def refusal(form: SubmitForm) -> SpecProblem:
    """Why the form refused what was posted, as a problem of the config
    (with its line and column when it knows them)."""
    errors = [error for field_errors in form.errors.as_data().values() for error in field_errors]
    where = next((error.params for error in errors if error.params and "line" in error.params), {})
    return SpecProblem("", " ".join(message for error in errors for message in error.messages),
                       where.get("line"), where.get("column"))
