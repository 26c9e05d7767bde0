"""The console's pages, mounted under /admin/console/ (same login, cookies and look as the admin)."""

from django.urls import path

from console.views import attention, budgets, dashboard, exports, jobs, pauses, runs, schedules

app_name = "console"

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/bulk/", jobs.job_bulk, name="jobs_bulk"),
    path("jobs/<int:job_id>/", jobs.job_detail, name="job"),
    path("jobs/<int:job_id>/act/", jobs.job_act, name="job_act"),
    path("failures/", jobs.failures, name="failures"),
    path("exports/", exports.export_list, name="exports"),
    path("exports/new/", exports.export_request, name="export_request"),
    path("exports/<int:export_id>/cancel/", exports.export_cancel, name="export_cancel"),
    path("pauses/", pauses.pause_list, name="pauses"),
    path("pauses/new/", pauses.pause_create, name="pause_create"),
    path("pauses/<int:pause_id>/resume/", pauses.pause_resume, name="pause_resume"),
    path("attention/", attention.attention, name="attention"),
    path("attention/<int:operation_id>/resolve/", attention.resolve, name="resolve"),
    path("budgets/", budgets.budget_list, name="budgets"),
    path("budgets/new/", budgets.budget_create, name="budget_create"),
    path("budgets/<int:budget_id>/", budgets.budget_detail, name="budget"),
    path("budgets/<int:budget_id>/update/", budgets.budget_update, name="budget_update"),
    path("prices/", budgets.price_set, name="price_set"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/start/", runs.run_start, name="run_start"),
    path("runs/stranded/", runs.stranded, name="stranded"),
    path("runs/<int:run_id>/", runs.run_detail, name="run"),
    path("runs/<int:run_id>/signal/", runs.run_signal, name="run_signal"),
    path("runs/<int:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<int:run_id>/move/", runs.run_move, name="run_move"),
    path("schedules/", schedules.schedule_list, name="schedules"),
    path("schedules/<int:schedule_id>/", schedules.schedule_detail, name="schedule"),
    path("schedules/<int:schedule_id>/act/", schedules.schedule_act, name="schedule_act"),
]
