from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone

from console.forms import LIMIT_FIELDS, BudgetCreateForm, BudgetLimitsForm, PriceForm
from console.roles import OPERATE, VIEW, actor, page
from console.views.base import render_console
from workers.models import Budget, ModelPrice
from workers.selectors.budgets import budget_bars
from workers.services.budgets import create_budget, set_model_price, update_budget


def _render_list(request: HttpRequest, *, create: BudgetCreateForm, price: PriceForm, status: int = 200) -> HttpResponse:
    response = render_console(
        request,
        "console/budgets.html",
        title="Budgets & prices",
        bars=budget_bars(now=timezone.now()),
        prices=ModelPrice.objects.order_by("model"),
        create_form=create,
        price_form=price,
    )
    response.status_code = status
    return response


@page(VIEW)
def budget_list(request: HttpRequest) -> HttpResponse:
    return _render_list(request, create=BudgetCreateForm(), price=PriceForm())


@page(OPERATE, methods=("POST",))
def budget_create(request: HttpRequest) -> HttpResponse:
    form = BudgetCreateForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            budget = create_budget(
                name=data["name"],
                scope=data["scope"],
                target=data["target"].strip(),
                tenant=data["tenant"].strip(),
                timezone=data["timezone"],
                pause_on_exhaust=data["pause_on_exhaust"],
                actor=actor(request),
                **{name: data[name] for name in LIMIT_FIELDS},
            )
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Budget {budget.name} created.")
            return HttpResponseRedirect(reverse("console:budgets"))
    return _render_list(request, create=form, price=PriceForm(), status=400)


def _render_budget(request: HttpRequest, budget: Budget, form: BudgetLimitsForm, *, status: int = 200) -> HttpResponse:
    (bar,) = budget_bars(now=timezone.now(), only=budget)
    response = render_console(
        request, "console/budget_edit.html", title=f"Budget {budget.name}", budget=budget, bar=bar, form=form
    )
    response.status_code = status
    return response


@page(VIEW)
def budget_detail(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = get_object_or_404(Budget, pk=budget_id)
    form = BudgetLimitsForm(initial={name: getattr(budget, name) for name in (*LIMIT_FIELDS, "pause_on_exhaust")})
    return _render_budget(request, budget, form)


@page(OPERATE, methods=("POST",))
def budget_update(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = get_object_or_404(Budget, pk=budget_id)
    form = BudgetLimitsForm(request.POST)
    if form.is_valid():
        try:
            update_budget(
                budget_id=budget.pk,
                actor=actor(request),
                pause_on_exhaust=form.cleaned_data["pause_on_exhaust"],
                **{name: form.cleaned_data[name] for name in LIMIT_FIELDS},
            )
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Budget {budget.name} updated.")
            return HttpResponseRedirect(reverse("console:budgets"))
    return _render_budget(request, budget, form, status=400)


@page(OPERATE, methods=("POST",))
def price_set(request: HttpRequest) -> HttpResponse:
    form = PriceForm(request.POST)
    if form.is_valid():
        try:
            price = set_model_price(actor=actor(request), **form.cleaned_data)
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Price of {price.model} saved.")
            return HttpResponseRedirect(reverse("console:budgets"))
    return _render_list(request, create=BudgetCreateForm(), price=form, status=400)
